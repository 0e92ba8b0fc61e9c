"""A claim on a lock, from its start to its outcome: an acquisition under way (``Pending``; on
the flat path, ``QuickTake``), a release or an extension under way (``Step``), and what an
acquisition got (``Claim``: the lock, the guarded work's result, or a refusal)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..backends.clients import LockAlias
from ..core import flows
from ..core.layout import KeyLayout
from ..core.requests import Eval
from ..exceptions import LockNotAcquired
from .holds import Hold

__all__ = ["Claim", "Pending", "QuickTake", "Step"]


@dataclass(frozen=True)
class Claim:
    """What :meth:`Lock.claim` got: the lock (``acquired``), the guarded work's result
    (``result``: it was done already), or neither (``refusal``: who holds it)."""

    acquired: bool
    result: bytes | None = None
    refusal: LockNotAcquired | None = None

    def raise_unless_acquired(self) -> None:
        """Raise the refusal unless the lock was acquired: a ``with`` block's entry."""
        if not self.acquired:
            assert self.refusal is not None
            raise self.refusal


@dataclass(eq=False, slots=True)
class Pending:
    """An acquisition under way."""

    owner: object
    alias: LockAlias
    plan: flows.AcquirePlan
    lease: float
    renew: bool


@dataclass(eq=False, slots=True)
class QuickTake:
    """A plain acquisition of a lock that may be free, prepared for the flat path
    (``core/uncontended.py``): ``command`` is all it sends while the lock is free."""

    owner: object
    alias: LockAlias
    token: str
    started: float  # monotonic
    max_wait: float
    lease_ms: int
    command: tuple[Any, ...]
    reply_timeout: float | None
    give_back: Callable[[], Sequence[Sequence[Any]]] | None  # sent if its reply never comes


@dataclass(eq=False, slots=True)
class Step:
    """A release or an extension under way: a release's one request (``request``, sent flat:
    ``core/uncontended.py``) or an extension's ``flow``; neither for a re-entrant level, which
    needs no I/O."""

    owner: object
    alias: LockAlias
    keys: KeyLayout
    hold: Hold
    flow: flows.Flow | None = None
    earlier_ran: bool = False  # release: an earlier try of it may have run in Redis
    lease: float = 0.0  # extend: the new length
    started: float = 0.0
    request: Eval | None = None
