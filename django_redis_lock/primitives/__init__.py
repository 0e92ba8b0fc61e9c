"""The leased primitives: ``Lock``, ``Semaphore``, ``lock_many``'s group, what they keep
between round trips (holds, claims, renewal) and what they report (logs, signals, metrics)."""
