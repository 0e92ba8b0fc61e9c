"""The locks on the suite's real server: Lock (sync and async), Semaphore, lock_many, the
decorators, run_once and the cache helpers; renewal, durations and keys; the protocol's races
forced step by step (the handoff, unfair locks, lost replies, cancellation, dead holders, forks
and copies); and the deterministic simulation's share of schedules (its harness is
``tests/simulation/``).

What only a topology other than one server adds is in ``tests/topologies/``.
"""
