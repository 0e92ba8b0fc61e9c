"""A semaphore's keys and scripts: the layout the acquisition flow (``flows.py``) runs for a
``Semaphore``, as ``LockKeys`` is a lock's.

    <ns>{<tag>}:s          the holders: a sorted set, token -> when its lease ends (server ms)
    <ns>{<tag>}:s:o        their owner records: token -> ``since|limit|owner record``
    <ns>{<tag>}:s:q        the waiters, first come first served (a list of tokens)
    <ns>{<tag>}:s:d        each waiter's liveness deadline, limit and owner record
    <ns>{<tag>}:s:w:<token> one waiter's wake-up list

A permit is a member of the sorted set: it ends when its score passes by the Redis server's
clock, whatever the clients' clocks say, and every script drops the ended ones before counting.
The holder keys expire with the last lease and the queue keys with the last waiter's liveness,
so nothing is left once the semaphore is idle. A semaphore's keys never meet a lock's of the
same name (``:s``), though they share its hash tag (one Redis Cluster slot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .lease import text_of

__all__ = ["NEXT_WAITERS", "Permit", "PermitKeys", "decode_permit"]

# A grant's message names the first waiters of the queue after it, at most this many: the
# holder's release expects the head to be among them (with N permits, up to N - 1 releases of
# others may come first) and wakes it in the same round trip, given its wake-up list. Past
# this many, a release that hands a permit to a waiter it did not expect wakes it with a
# second round trip.
NEXT_WAITERS = 16


@dataclass(frozen=True)
class PermitKeys:
    """The keys of one semaphore, and its scripts (``lua/permit_*.lua``)."""

    lease: str  # the holders
    owners: str
    queue: str
    waiters: str
    wake_prefix: str

    TAKE: ClassVar[str] = "permit_acquire"
    JOIN: ClassVar[str] = "permit_acquire"
    RELEASE: ClassVar[str] = "permit_release"
    EXTEND: ClassVar[str] = "permit_extend"

    @classmethod
    def of(cls, tagged: str) -> PermitKeys:
        """The keys of the semaphore whose names start with ``tagged`` (``<ns>{<tag>}``)."""
        holders = f"{tagged}:s"
        return cls(holders, f"{holders}:o", f"{holders}:q", f"{holders}:d", f"{holders}:w:")

    @property
    def holders(self) -> str:
        return self.lease

    def wake(self, token: str) -> str:
        return self.wake_prefix + token

    def _all(self, wake: str) -> tuple[str, ...]:
        return (self.lease, self.owners, self.queue, self.waiters, wake)

    def release_keys(self, expected: str, token: str = "") -> tuple[str, ...]:
        """``permit_release.lua``'s keys; ``expected``: tokens separated by spaces (a
        permit keeps no result: ``token`` does not matter)."""
        if not expected:
            return self._all(self.wake_prefix)
        waiters = expected.split(" ")[:NEXT_WAITERS]
        return (*self._all(self.wake(waiters[0])), *(self.wake(t) for t in waiters[1:]))

    def extend_keys(self) -> tuple[str, ...]:
        return (self.lease, self.owners)

    def take_call(self, plan: Any, flags: str) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """``permit_acquire.lua`` in mode 0: take a permit, never queue."""
        return self.join_call(plan, 0, flags, 1000)

    def join_call(
        self, plan: Any, mode: int, flags: str, liveness_ms: int
    ) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        args = (plan.token, plan.lease_ms, plan.record, mode, flags, liveness_ms, plan.limit)
        return self._all(self.wake(plan.token)), args


@dataclass(frozen=True)
class Permit:
    """One holder's entry, as ``permit_acquire.lua`` writes it: when it took its permit (server
    ms), under which limit, and its owner record (``lease.OwnerRecord.encode()``)."""

    token: str
    since_ms: int
    limit: int
    record: str

    def as_lease(self) -> str:
        """The entry as a lock's lease value (``lease.decode_lease`` reads it)."""
        return f"{self.token}|{self.since_ms}|0|{self.record}"


def decode_permit(token: bytes | str, entry: bytes | str) -> Permit:
    """Raises ``ValueError`` for an entry this module did not write."""
    token = token.decode() if isinstance(token, bytes) else token
    text = text_of(entry)
    parts = text.split("|", 2)
    if len(parts) != 3:
        raise ValueError("not a permit: expected since|limit|record")
    return Permit(token, int(parts[0]), int(parts[1]), parts[2])
