"""The flat path of an acquisition (``core/uncontended.py``): a plain lock that may be free is
taken with one bare ``SET`` the caller sends, and nothing else on the way; a lock that was
held (or a grant that came too late) goes on by the flows, from the queue on. What a primitive
asks of its bookkeeping before and after that ``SET`` (``leased.Leased.claim``)."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

from ..backends.base import give_back_command
from ..core import durations, flows, uncontended
from . import owners
from .claims import Claim, Pending, QuickTake
from .owners import current_owner
from .strays import strays

if TYPE_CHECKING:
    from .bookkeeping import Bookkeeping

__all__ = ["TAKEN", "settled", "take"]

# What a flat acquisition that took the lock answers (a Claim is immutable: one for all).
TAKEN = Claim(True)


def take(book: Bookkeeping, wait: float | None) -> QuickTake | None:
    """An acquisition through ``book`` prepared for the flat path, or None when the flows
    must take it from the start: not a plain lock (``Options.flat``); a release of this object
    to finish; held by this owner already (the flows say why not); seen contended lately (it
    joins the queue at once); a wait of this process to step out of the lock's line first."""
    resolved = book.options()
    if not resolved.flat or book.release_failed:
        return None
    owner = current_owner()
    started = time.monotonic()
    keys = resolved.keys
    if (
        book.contended_lately(keys.lease, started)
        or book.hold_of(owner) is not None
        or strays.waiting(keys.lease)
    ):
        return None
    if wait is not None:
        wait = durations.seconds(wait, "wait", wait=True, allow_inf=True)
    max_wait = resolved.wait if wait is None else wait
    token = owners.new_token()
    record = resolved.records.encoded(owner, resolved.lease)
    return QuickTake(
        owner, resolved.alias, token, started, max_wait, resolved.lease_ms,
        uncontended.take_free(keys.lease, token, record, resolved.lease_ms),
        uncontended.reply_budget(max_wait), functools.partial(give_back_command, keys, token),
    )  # fmt: skip


def settled(book: Bookkeeping, quick: QuickTake, reply: Any) -> Claim | Pending:
    """What the flat try's ``reply`` means: the lock taken (held from now on, renewed,
    reported: :data:`TAKEN`), or, when it was held or the grant came too late to be of use, the
    flows' path from the queue on (join.lua takes a free lock too, and finds a lease granted
    too late ours), with the try's token and start, so that its wait counts from the try."""
    resolved = book.options()
    if reply is not None and not uncontended.learnt_late(
        quick.started, quick.lease_ms, time.monotonic()
    ):
        book.took(
            quick.owner, quick.alias, resolved.keys, quick.token, quick.started,
            resolved.lease, resolved.renew, flows.Acquired(0, quick.lease_ms, quick.started, ""),
        )  # fmt: skip
        return TAKEN
    return resolved.acquisition(
        quick.owner, wait=quick.max_wait, want_result=False, fencing=False, limit=0,
        job_id=None, started=quick.started, on_contended=book.contended, first="join",
        token=quick.token, fair=book.fair,
    )  # fmt: skip
