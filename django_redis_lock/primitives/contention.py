"""Which locks this process found busy lately, by lease key: an acquisition of one of them joins
its line at once, instead of first trying a bare ``SET`` that would fail (a round trip saved per
acquisition of a busy lock; join.lua takes a free lock too).

Per process, not per ``Lock`` object: code makes a new ``Lock(name)`` for each use (``with
Lock(f"order:{pk}")`` in a view, ``async with Lock(name)`` in each of many tasks), which would
forget it at once.
"""

from __future__ import annotations

import os
import threading

__all__ = ["MEMORY", "Contention", "contention"]

#: How long a lock found busy counts as busy, in seconds.
MEMORY = 1.0
#: How many locks are remembered at most (the one found busy longest ago is forgotten first).
MOST = 4096


class Contention:
    """The locks this process found busy lately (see the module docstring)."""

    def __init__(self) -> None:
        self.clear()

    def saw(self, key: str, now: float) -> None:
        """An acquisition of the lock whose lease is ``key`` had to wait (or gave up) at
        ``now`` (monotonic)."""
        with self._lock:
            self._seen.pop(key, None)  # (re-inserted last: the dict's order is the age)
            self._seen[key] = now
            if len(self._seen) > MOST:
                del self._seen[next(iter(self._seen))]

    def lately(self, key: str, now: float) -> bool:
        """Whether the lock whose lease is ``key`` was found busy less than ``MEMORY`` ago.
        A dict lookup, without the lock: on every acquisition."""
        seen = self._seen.get(key)
        return seen is not None and now - seen < MEMORY

    def clear(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}


contention = Contention()


os.register_at_fork(after_in_child=contention.clear)
