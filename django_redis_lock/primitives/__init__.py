"""The leased primitives, in the caller's thread or task: ``Lock`` (``lock.py``), ``Semaphore``
(``semaphore.py``) and ``lock_many``'s group (``group.py``), all built on ``leased.py``; what they
keep between round trips (``bookkeeping.py``: the options, the holds, the claims); the two
daemon threads that serve them (``background/``); and what they report (``reports.py``).

Inner order, from the top (an import-linter contract, ``make lint``): the group, then the lock
and the semaphore, their shared API, the flat path, the bookkeeping, the options; then the
threads and the per-process records (claims, errors, re-entrancy, own tokens, strays, reports);
at the bottom what a hold is, who owns it, and the keys.
"""
