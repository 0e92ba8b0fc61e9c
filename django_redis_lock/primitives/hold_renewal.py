"""How a hold is kept alive by the watchdog (``renewal.py``): its renewal started when it is
taken, and stopped when it ends.

A renewed hold's lease is made only if the hold outlives the watchdog's next look (``defer``):
most holds end long before a third of their lease, and then renewing them cost a dict entry
and nothing more. The look (:func:`_grown_up`, on the watchdog's thread) and the hold's end
(:func:`stop`) each take the deferral back under the primitive's lock: exactly one of them gets
it, so a hold that ended is never renewed, and one that lives on always is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..backends import backend_of
from ..backends.clients import LockAlias
from ..core.layout import KeyLayout
from .holds import Hold, HoldWatch
from .renewal import RenewedLease, renewer

__all__ = ["start", "stop"]

ReportLost = Callable[[Hold, str], None]


def start(
    hold: Hold, owner: object, alias: LockAlias, keys: KeyLayout, *, lease: float, renew: bool,
    sent_at: float, granted: float, title: str, state: threading.Lock, report_lost: ReportLost,
) -> None:  # fmt: skip
    """Keep ``hold`` alive if it needs it: renewed (``renew``), or a lease handed over short
    (``granted`` < ``lease``, by release.lua), lengthened once to the whole lease. ``title``
    names it in the logs; ``report_lost(hold, reason)`` is told of a loss (a bound method of
    the primitive's bookkeeping, kept weakly once the lease is made)."""
    if renew and granted >= lease:
        hold.young = True
        renewer.defer(
            hold, sent_at + lease / 3, _grown_up, hold, owner, alias, keys, lease, title,
            state, report_lost,
        )  # fmt: skip
    elif renew or granted < lease:
        until = None if renew else sent_at + lease
        hold.renewal = _lease(hold, owner, alias, keys, lease, until, title, report_lost)
        hold.renewal.confirmed(sent_at, granted)
        renewer.add(hold.renewal)


def stop(hold: Hold, state: threading.Lock) -> None:
    """``hold`` is no longer to be renewed (released, lost, let go)."""
    if hold.young:
        with state:
            renewer.take_back(hold)
            hold.young = False
    if hold.renewal is not None:
        renewer.remove(hold.renewal)


def _grown_up(
    hold: Hold, owner: object, alias: LockAlias, keys: KeyLayout, lease: float, title: str,
    state: threading.Lock, report_lost: ReportLost,
) -> None:  # fmt: skip
    """On the watchdog's thread: a deferred hold outlived its look: renewed from now on,
    unless it ended meanwhile."""
    with state:
        if not renewer.take_back(hold):
            return  # (taken back by stop(): it ended)
        if hold.count > 0 and hold.releasing_since is None and hold.lost_reason is None:
            renewal = _lease(hold, owner, alias, keys, lease, None, title, report_lost)
            renewal.confirmed(hold.lease_ends_at - hold.lease, hold.lease)
            hold.renewal = renewal
            renewer.add(renewal)


def _lease(
    hold: Hold, owner: object, alias: LockAlias, keys: KeyLayout, lease: float,
    until: float | None, title: str, report_lost: ReportLost,
) -> RenewedLease:  # fmt: skip
    """The watchdog's lease of ``hold``: it keeps the hold weakly, so that a lease nobody can
    release any more is not renewed for ever (``until``: see ``RenewedLease``)."""
    watch = HoldWatch(hold, owner, report_lost)
    return RenewedLease(
        client=backend_of(alias).client,
        key=keys.lease,
        token=hold.token,
        lease=lease,
        on_lost=watch.lost,
        name=title,
        abandoned=watch.abandoned,
        until=until,
        script=keys.EXTEND,
        keys=keys.extend_keys(),
    )
