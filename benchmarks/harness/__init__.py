"""What the benchmark scripts share, one idea per module; every script imports it by public name.

- ``servers``: the private servers: redis-server, valkey-server (``dev/embedded_redis.py``) and a
  throw-away PostgreSQL cluster.
- ``params``: ``bench.py``'s run parameters (full and ``--quick``).
- ``rivals``: each compared lock as a ``Handle`` (ours, redis-py, django-redis,
  python-redis-lock, pottery, PostgreSQL advisory locks, redis-fifo-lock, the raw floor).
- ``variants``: ``bench.py``'s rows: which rival, with which options, under which title.
- ``records``: request counting, server CPU and command counts, percentile and Jain's index.
- ``uncontended``, ``contention``, ``crash``, ``memory``: ``bench.py``'s four measurements.
- ``machine``: the machine and the run (git, library versions, the progress log).
- ``markdown``: the results files' tables and heading.
- ``tables``, ``targets``, ``report``: ``bench.py``'s ``results.md``.
- ``fault_proxy``: a TCP proxy that injects faults (``bench_faults.py``).
"""
