"""The lock engine's decisions, without I/O: what a lease value says (``lease.py``) and what
each operation asks of Redis and makes of the answers (``flows.py``). Nothing here imports redis;
``backends/`` carries the requests out, sync or async."""
