"""The benchmarks: scripts run as modules from the repository's root, so that this package, the
work tree's ``django_redis_lock`` and its tools (``dev``, ``tests``) import by name::

    .venv/bin/python -m benchmarks.bench --quick

``make bench`` runs them all. What they share (the private servers, the rival locks, the
measurements, the counters and the report) is in ``benchmarks.harness``.
"""
