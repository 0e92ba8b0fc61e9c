"""Places in a lock's line that this process left behind, stepped out by its next
acquisition of that lock."""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["Strays", "strays"]


class Strays:
    """The places in a lock's line this process left behind: an acquisition that could not
    step out of the line (Redis unreachable, its connection cut: a failover, a network blip)
    leaves its token queued, counted alive for up to a block and a second, and whoever queued
    behind it waits that long. The next acquisition of that lock in this process steps it out
    first (``flows.AcquirePlan.strays``). A token is kept until the queue would skip it anyway.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, list[tuple[str, float]]] = {}

    def left(self, plan: Any, token: str, until: float) -> None:
        """``plan``'s acquisition could not step ``token`` out of its lock's line; the queue
        counts it alive until ``until`` (monotonic)."""
        with self._lock:
            self._by_key.setdefault(plan.keys.lease, []).append((token, until))

    def waiting(self, key: str) -> bool:
        """Whether tokens of this process may be left in the line of the lock whose lease is
        ``key`` (a dict lookup, none when there are none)."""
        return bool(self._by_key) and key in self._by_key

    def take(self, key: str, now: float) -> tuple[tuple[str, float], ...]:
        """The tokens left in the line of the lock whose lease is ``key`` and still counted
        alive at ``now``, forgotten here (an acquisition steps them out). Costs a dict lookup
        when there are none, on every acquisition."""
        if not self._by_key:
            return ()
        with self._lock:
            taken = self._by_key.pop(key, [])
            for other, entries in list(self._by_key.items()):  # forget the lapsed, all locks
                entries[:] = [entry for entry in entries if entry[1] > now]
                if not entries:
                    del self._by_key[other]
        return tuple(entry for entry in taken if entry[1] > now)

    def clear(self) -> None:
        self._lock = threading.Lock()
        self._by_key = {}


strays = Strays()


os.register_at_fork(after_in_child=strays.clear)
