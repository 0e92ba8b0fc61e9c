"""Development tooling of this repository, not part of the package (never installed).

- ``embedded_redis``: a private, throw-away ``redis-server`` (or ``valkey-server``) for the
  test suite, ``make demo`` and ``benchmarks/``.
- ``import_contracts``: an import-linter contract of our own (no function-level imports),
  named in setup.cfg's ``[importlinter]`` and run by ``make lint``.
"""
