"""Re-entrant locks: which hold each thread or task has of each re-entrant lock, so that a
second acquisition deeper in the same call stack re-enters it instead of waiting for itself."""

from __future__ import annotations

import os
import threading
import weakref

from .holds import Hold

__all__ = ["ReentrantHolds", "reentrant_holds"]


class ReentrantHolds:
    """Which hold each thread / task has of each re-entrant lock, across Lock objects, so that
    ``obj.lock()`` called again deeper in the same call stack re-enters the hold: a level more,
    counted here, with no round trip (a thread's re-entry never leaves its process)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._lock = threading.Lock()
        # owner -> lease key -> (the hold, the object that took it, weakly).
        self._holds: weakref.WeakKeyDictionary[
            object, dict[str, tuple[Hold, weakref.ref[object]]]
        ] = weakref.WeakKeyDictionary()

    def get(self, owner: object, key: str) -> Hold | None:
        """``owner``'s hold of ``key``; None (and forgotten) once the object that took it is
        gone: nobody can release that hold any more, so re-entering it would hold nothing."""
        with self._lock:
            held = self._holds.get(owner, {})
            entry = held.get(key)
            if entry is None:
                return None
            if entry[1]() is None:
                del held[key]
                return None
            return entry[0]

    def set(self, owner: object, key: str, hold: Hold, taker: object) -> None:
        with self._lock:
            self._holds.setdefault(owner, {})[key] = (hold, weakref.ref(taker))

    def forget(self, owner: object, key: str, hold: Hold) -> None:
        with self._lock:
            held = self._holds.get(owner, {})
            entry = held.get(key)
            if entry is not None and entry[0] is hold:
                del held[key]


reentrant_holds = ReentrantHolds()


# The parent's holds: re-entering one in a forked child would join the parent's hold.
os.register_at_fork(after_in_child=reentrant_holds.clear)
