"""What a Lock carries between its API and its flows: the outcome it reports (``Claim``), the
settings it resolved (``Resolved``), and an acquisition, release or extension under way."""

from __future__ import annotations

from dataclasses import dataclass

from .connection import LockAlias
from .core import flows
from .core.lease import LockKeys
from .exceptions import LockNotAcquired
from .holds import Hold, OwnerRecords

__all__ = ["Claim", "Pending", "Resolved", "Step"]


@dataclass(frozen=True)
class Claim:
    """What :meth:`Lock.claim` got: the lock (``acquired``), the guarded work's result
    (``result``: it was done already), or neither (``refusal``: who holds it)."""

    acquired: bool
    result: bytes | None = None
    refusal: LockNotAcquired | None = None


@dataclass(frozen=True)
class Resolved:
    """What a Lock takes from the settings, on first use."""

    alias: LockAlias
    keys: LockKeys
    lease: float
    renew: bool
    wait: float
    quorum: bool
    replicas: int  # that must confirm an acquisition (MIN_REPLICAS)
    replica_timeout_ms: int
    records: OwnerRecords  # its acquisitions' owner records


@dataclass(eq=False, slots=True)
class Pending:
    """An acquisition under way."""

    owner: object
    alias: LockAlias
    plan: flows.AcquirePlan
    lease: float
    renew: bool


@dataclass(eq=False, slots=True)
class Step:
    """A release or an extension under way (``flow`` None: a re-entrant level, no I/O)."""

    owner: object
    alias: LockAlias
    keys: LockKeys
    hold: Hold
    flow: flows.Flow | None
    earlier_ran: bool = False  # release: an earlier try of it may have run in Redis
    lease: float = 0.0  # extend: the new length
    started: float = 0.0
