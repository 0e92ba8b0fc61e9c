"""What one held lock's record says, for people: :class:`LockInfo`, decoded from the lease
value and its TTL (``lock_info``). Read by the registry, the admin page and the CLI."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..core.labels import OTHER, group_of
from ..core.lease import decode_lease, is_reservation, job_of
from ..primitives.keys import name_in_key

__all__ = ["LockInfo", "lock_info", "seconds_left", "text"]


def text(value: Any) -> str:
    """A reply as text (bytes decoded, undecodable bytes replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class LockInfo:
    """One held lock, as its record says (``valid`` is False when the record is unreadable)."""

    key: str
    name: str
    token: str
    ttl: float  # seconds left on the lease; math.inf for a key without an expiry
    label: str | None = None
    host: str | None = None
    pid: int | None = None
    thread: str | None = None
    task: str | None = None
    acquired_at: datetime | None = None  # by the taker's clock (the server's, when handed over)
    lease: float | None = None
    fencing_token: int | None = None
    guard: str | None = None  # the task guard's mode, when one holds it
    group: str = OTHER  # its metrics group: the holder's group=, else the name's (core/labels.py)
    waiting: int = 0  # queued for it when it was read
    valid: bool = True
    raw: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def expires(self) -> bool:
        """False for a key without an expiry: it never frees (our scripts never leave one)."""
        return self.ttl != math.inf

    @property
    def held_for(self) -> float | None:
        """Seconds since its holder took it (by the taker's clock: the server's, when handed
        over), never below 0; None when the record does not say."""
        if self.acquired_at is None:
            return None
        return max(0.0, (datetime.now(timezone.utc) - self.acquired_at).total_seconds())

    @property
    def job_id(self) -> str | None:
        """The job it is held for (``Lock(..., job_id=...)``), or None."""
        return job_of(self.token)

    @property
    def queued(self) -> bool:
        """Whether it is a job's reservation (the job waits in a queue,
        ``task_guards/reservations.py``) rather than a hold of a running process."""
        return is_reservation(self.token)

    @property
    def holder(self) -> str:
        parts = [self.host or "?", str(self.pid or "?"), self.thread or "?"]
        if self.task:
            parts.append(self.task)
        return "/".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, with stable keys (the CLI's ``--json``)."""
        return {
            "name": self.name,
            "label": self.label,
            "host": self.host,
            "pid": self.pid,
            "thread": self.thread,
            "task": self.task,
            "acquired_at": self.acquired_at.isoformat() if self.acquired_at else None,
            "ttl": round(self.ttl, 3) if self.expires else None,  # None: it never expires
            "lease": self.lease,
            "fencing_token": self.fencing_token,
            "token": self.token,
            "job_id": self.job_id,
            "queued": self.queued,
            "guard": self.guard,
            "group": self.group,
            "waiting": self.waiting,
            "key": self.key,
            "valid": self.valid,
        }


def seconds_left(pttl: int) -> float:
    """A ``PTTL`` reply in seconds; ``math.inf`` for a key without an expiry."""
    return math.inf if pttl == -1 else pttl / 1000


def lock_info(key: str, value: Any, pttl: int, waiting: int = 0) -> LockInfo:
    """The record of the lease ``key``, whose value is ``value`` and ``PTTL`` is ``pttl``
    (``waiting``: its queue's length)."""
    try:
        lease = decode_lease(value)
    except ValueError:
        return LockInfo(
            key=key, name=key, token="", ttl=seconds_left(pttl), waiting=waiting, valid=False,
            raw={"value": text(value)},
        )  # fmt: skip
    owner = lease.owner
    name = owner.name or name_in_key(key) or key
    return LockInfo(
        key=key,
        name=name,
        token=lease.token,
        ttl=seconds_left(pttl),
        label=owner.label,
        host=owner.host,
        pid=owner.pid,
        thread=owner.thread,
        task=owner.task,
        acquired_at=lease.acquired_at,
        lease=owner.lease,
        fencing_token=lease.fence or None,
        guard=owner.guard,
        group=owner.group or group_of(name),
        waiting=waiting,
        raw={"value": text(value)},
    )
