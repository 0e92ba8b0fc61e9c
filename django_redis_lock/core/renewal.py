"""The watchdog's schedule: which held leases are due for renewal, which ended while their
renewal was under way, and what a renewal's result means for each lease.

No I/O and no clock of its own: every decision is given ``now`` (monotonic seconds), so tests
drive it with plain numbers; ``primitives/background/renewal.py`` runs it on a thread, with
``time.monotonic``, and does the talking to Redis.

The rules: a lease is renewed at about a third of its length. When one falls due, every lease
due within a sixth of its length joins it, so leases renewed together stay together. A lease
whose renewal failed is retried on its own, at most ``RETRY_INTERVAL`` apart (more often near
its end), and is lost when its end passes first. Leases go out in one batch per client, and a
client's batch under way holds up no other client's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .durations import clock_allowance, readable

__all__ = ["RETRY_INTERVAL", "Renewal", "RenewedLease", "Schedule"]

logger = logging.getLogger("django_redis_lock")

# While Redis cannot be reached, retry at most this often (and more often near the end).
RETRY_INTERVAL = 0.5
# A look this much later than the thread planned means the process did not run meanwhile
# (paused, or starved of CPU): a lease that ended then was this process's to lose, not Redis's.
PAUSED = 0.25


@dataclass(eq=False, slots=True)
class RenewedLease:
    """One held lease to keep alive. ``expires_at`` is monotonic: when the lease ends unless
    renewed (as far as this process knows). ``name`` names it in logs (kind and name:
    ``Lock 'report'``); ``abandoned()`` says why nobody can release the lease any more (None:
    someone may).
    ``until``: a lease of fixed length that was handed over short (``release.lua``): lengthened
    once, to end then (monotonic), and not renewed after that. ``script`` and ``keys``: how it
    is renewed (a lock's lease: ``extend.lua`` on ``key``; a semaphore's permit: its own)."""

    client: Any
    key: str
    token: str
    lease: float
    on_lost: Callable[[str], None]
    name: str = ""
    abandoned: Callable[[], str | None] = field(default=lambda: None, repr=False)
    until: float | None = None
    script: str = "extend"
    keys: tuple[str, ...] = ()
    active: bool = True  # False once removed (released, lost or abandoned)
    length: float = 0.0  # seconds: what the latest confirmation gave it (a handed lease: less)
    expires_at: float = 0.0
    due: float = field(default=0.0, repr=False)
    failure: str = ""  # why the latest renewal did not happen, while it is retried
    # How long after the lease's end (as far as we know) this process got round to its renewal
    # under way: 0.0 when in time. Late, the process was paused or starved (SIGSTOP, a long
    # GC, a frozen VM), and only Redis can say whether the lease is still ours (if it is, nobody
    # else held it meanwhile): its answer is waited for until ``answer_by`` (monotonic).
    late: float = 0.0
    answer_by: float | None = None

    def confirmed(self, at: float, seconds: float | None = None) -> None:
        """Redis confirmed at ``at`` (monotonic) that the lease runs ``seconds`` from then."""
        length = self.lease if seconds is None else seconds
        self.length = min(length, self.lease)
        self.expires_at = at + length
        self.due = at + self.length / 3
        self.failure = ""

    def milliseconds(self, now: float) -> int:
        """The length to renew it with, from ``now``."""
        seconds = self.lease if self.until is None else self.until - now
        return max(1, int(seconds * 1000))

    def ends_at(self) -> float:
        """When the lease may have ended in Redis already (its clock may run a little fast)."""
        return self.expires_at - clock_allowance(self.lease)

    def fell_behind(self, now: float) -> None:
        """This process got round to the lease only at ``now``, after its end: its renewal's
        answer decides, waited for one lease length."""
        self.late = now - self.ends_at()
        self.answer_by = now + self.length

    def given_up_at(self) -> float:
        """When a renewal under way that has not answered makes the lease lost."""
        return self.answer_by if self.answer_by is not None else self.ends_at()

    def gone(self) -> str:
        """Why the lease was gone when its renewal reached Redis."""
        if self.late:
            return (
                "its lease ended before this process could renew it: the renewal went out "
                f"{readable(self.late)} after the lease's end (the process was paused or "
                "starved of CPU: a SIGSTOP, a long garbage collection, a frozen VM?)"
            )
        return "its lease was gone when renewing (expired or deleted)"

    def unrenewed(self) -> str:
        """Why the lease ended unrenewed, when Redis never said it was gone."""
        if self.failure:
            return f"Redis could not be reached to renew it ({self.failure})"
        return "Redis did not answer its renewal before the lease ended (stalled or unreachable)"


def _why_abandoned(lease: RenewedLease) -> str | None:
    """Why nobody can release ``lease`` any more (None: someone still may, or it could not be
    told: renewed, or reported lost, as before)."""
    try:
        return lease.abandoned()
    except Exception:  # the watchdog must never die
        logger.exception("django-redis-lock: could not tell who holds %s", lease.key)
        return None


@dataclass(slots=True)
class Renewal:
    """What :meth:`Schedule.look` found at one moment."""

    ended: list[RenewedLease]  # its client's renewal still under way at its end: lost
    abandoned: list[tuple[RenewedLease, str]]  # nobody can release it any more: let go
    batches: dict[int, list[RenewedLease]]  # due now, by client: one batch each, to send


class Schedule:
    """The held leases of a process, and the clients whose renewals are under way.

    ``add`` and ``remove`` are single dict operations (atomic under the GIL), so an acquisition
    and a release never wait for the watchdog; everything else is called by its one thread."""

    def __init__(self) -> None:
        self.leases: dict[int, RenewedLease] = {}
        self.busy: set[int] = set()  # id() of the clients with a batch under way
        self.added = 0  # counts on with every add(): the thread can tell it missed one
        self.planned: float | None = None  # when the thread meant to look next (next_look)

    def add(self, lease: RenewedLease) -> None:
        lease.active = True
        self.leases[id(lease)] = lease
        self.added += 1

    def remove(self, lease: RenewedLease) -> None:
        lease.active = False
        self.leases.pop(id(lease), None)

    def look(self, now: float) -> Renewal:
        """Sort the leases out at ``now``: the ended and the abandoned leave the schedule; the
        due are grouped by client, whose batch is then under way until :meth:`finished`."""
        ended, abandoned, due = [], [], []
        # Looking much later than planned: this process did not run meanwhile (see ``late``).
        paused = self.planned is not None and now - self.planned > PAUSED
        for lease in list(self.leases.values()):  # a copy: others add and remove meanwhile
            if not lease.active:
                continue
            if id(lease.client) in self.busy:
                if paused and lease.answer_by is None and lease.ends_at() <= now:
                    lease.fell_behind(now)  # its answer may be waiting, unread
                if lease.given_up_at() <= now:
                    # Its holder gone while its renewal was under way: nobody to tell of a
                    # loss, but the caller's mistake is still said (abandoned).
                    reason = _why_abandoned(lease)
                    if reason is None:
                        ended.append(lease)
                    else:
                        abandoned.append((lease, reason))
            elif lease.due <= now + (0 if lease.failure else lease.length / 6):
                reason = _why_abandoned(lease)
                if reason is None:
                    if lease.ends_at() <= now and not lease.failure:
                        lease.fell_behind(now)
                    due.append(lease)
                else:
                    abandoned.append((lease, reason))
        for lease in ended:
            self.remove(lease)
        for lease, _ in abandoned:
            self.remove(lease)
        batches: dict[int, list[RenewedLease]] = {}
        for lease in due:
            batches.setdefault(id(lease.client), []).append(lease)
        self.busy.update(batches)
        return Renewal(ended, abandoned, batches)

    def next_look(self) -> float | None:
        """When a lease next falls due, or one whose renewal is under way ends (None: there
        is no lease): the look the thread plans."""
        self.planned = min(
            (
                lease.given_up_at() if id(lease.client) in self.busy else lease.due
                for lease in list(self.leases.values())
            ),
            default=None,
        )
        return self.planned

    def finished(
        self,
        client_id: int,
        leases: Sequence[RenewedLease],
        results: Sequence[Any],
        lengths: Sequence[int],
        sent_at: float,
        now: float,
    ) -> tuple[list[tuple[RenewedLease, str]], list[RenewedLease]]:
        """A batch came back: ``results[i]`` is 1 (renewed by ``lengths[i]`` ms from
        ``sent_at``), an exception (not renewed), or anything else (the lease was gone).
        Returns (the leases lost, with why; the leases to retry, with ``failure`` set)."""
        self.busy.discard(client_id)
        lost: list[tuple[RenewedLease, str]] = []
        retried: list[RenewedLease] = []
        for lease, result, ms in zip(leases, results, lengths, strict=True):
            if not lease.active:
                continue  # released meanwhile
            if result == 1:
                lease.late, lease.answer_by = 0.0, None  # (late or not, nobody held it meanwhile)
                lease.confirmed(sent_at, ms / 1000)
                if lease.until is not None:  # lengthened as asked: done with it
                    self.remove(lease)
            elif isinstance(result, BaseException):
                lease.failure, lease.answer_by = str(result), None
                if now >= lease.expires_at:
                    self.remove(lease)
                    lost.append((lease, lease.unrenewed()))
                else:
                    lease.due = now + min(RETRY_INTERVAL, (lease.expires_at - now) / 4)
                    retried.append(lease)
            else:
                self.remove(lease)
                lost.append((lease, lease.gone()))
        return lost, retried
