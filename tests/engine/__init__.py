"""The layers that need no server: the sans-I/O core (``core/``: flows, the watchdog's
schedule), the public errors, and the settings and argument hints (``conf``, ``hints``).

No Redis is started for these tests (``conftest.py`` here turns the suite's Redis fixtures
off): a test that needs a server belongs in another folder.
"""
