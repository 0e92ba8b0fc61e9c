"""A hold: one owner's acquisition through one Lock object, in the process that made it.

A hold never crosses a ``fork()``: the child inherits the parent's memory, holds included, but
not the right to release or renew them (the parent is still inside its critical section), so a
hold carries the pid that took it and is ignored elsewhere. Nor does it outlive its owner: the
watchdog asks :class:`HoldWatch` whether anyone can still release a lease before renewing it.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.durations import clock_allowance

if TYPE_CHECKING:
    from ..core.renewal import RenewedLease

__all__ = ["Hold", "HoldWatch"]


@dataclass(eq=False, slots=True)
class Hold:
    """One owner's acquisition through one Lock object, in the process ``pid`` that made it."""

    token: str
    fence: int | None
    acquired_at: float  # monotonic
    lease: float  # seconds: the latest length the lease was given
    lease_ends_at: float  # monotonic: when the lease ends unless extended, as far as we know
    pid: int
    count: int = 1  # levels held (re-entrant locks count them here, not in Redis)
    next_token: str = ""  # the waiter we expect first in line when we release ('' unknown)
    renewal: RenewedLease | None = None
    lost_reason: str | None = None
    # When a release was first tried (monotonic), until it completes; and whether a try that
    # failed may have run in Redis all the same (sent, and its reply lost or cancelled): a
    # retry that finds the lease gone knows whether it was our own release that got through.
    releasing_since: float | None = None
    release_may_have_run: bool = False
    # What that release keeps for the duplicates (``release(result=...)``: the result and its
    # ms), for a retry: a retry without it would hand the lock to a waiter for the result.
    releasing_with: tuple[Any, ...] = ()
    # Kept alive (renewed, or a short handed lease to lengthen), and its lease deferred to the
    # watchdog's next look (``renewal`` None until then): see background/renewal.start.
    young: bool = False

    def ends_at(self) -> float:
        """When the lease ends (monotonic), by the latest renewal or extension we know of."""
        return self.renewal.expires_at if self.renewal is not None else self.lease_ends_at

    def may_have_ended(self, now: float) -> bool:
        """Whether the lease may have ended in Redis by ``now`` (monotonic): Redis' clock may
        run a little fast (``clock_allowance``)."""
        return now >= self.ends_at() - clock_allowance(self.lease)


class HoldWatch:
    """What the watchdog needs of a hold, without keeping its Lock object or its owner alive:
    whom to tell when the lease is lost, and whether anyone can still release it."""

    def __init__(self, hold: Hold, owner: object, report_lost: Any) -> None:
        """``report_lost``: a bound method ``(hold, reason)`` of the Lock, held weakly (a plain
        weak reference to its object: cheaper to make than a ``WeakMethod``, on every
        acquisition)."""
        self._hold = hold
        self._lock = weakref.ref(report_lost.__self__)
        self._report = report_lost.__func__
        self._owner = weakref.ref(owner)
        self._owner_is_task = isinstance(owner, asyncio.Task)
        # Its name now: the owner may be gone, and collected, by the time anyone asks (a
        # finished task). Only the name: the sentence is made when asked, which is rare.
        self._owner_name: str | None = (
            owner.get_name() if isinstance(owner, asyncio.Task) else getattr(owner, "name", None)
        )

    def lost(self, reason: str) -> None:
        lock = self._lock()
        if lock is not None:
            self._report(lock, self._hold, reason)

    def abandoned(self) -> str | None:
        """Why nobody can release this hold any more (None: someone still may)."""
        if self._lock() is None:
            return "the object that took it was garbage-collected"
        owner: Any = self._owner()
        if owner is None:
            ended = True
        elif self._owner_is_task:
            ended = owner.done()
        else:
            ended = isinstance(owner, threading.Thread) and not owner.is_alive()
        if not ended:
            return None
        if self._owner_name is None:
            return "its owner, which took it, has ended"
        kind = "task" if self._owner_is_task else "thread"
        return f"the {kind} {self._owner_name!r}, which took it, has ended"
