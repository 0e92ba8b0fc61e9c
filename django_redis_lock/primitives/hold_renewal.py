"""How a hold is kept alive by the watchdog (``renewal.py``): its renewal started when it is taken,
and stopped when it ends.

A hold's lease (renewed, or a short one handed over to be lengthened) is made only if the hold
outlives the watchdog's next look (``defer``): most holds end long before a third of their lease,
and then keeping them alive cost a dict entry and nothing more. The look (:func:`_grown_up`, on the
watchdog's thread) and the hold's end (:func:`stop`) each take the deferral back under the
primitive's lock: exactly one of them gets it, so a hold that ended is never renewed, and one that
lives on always is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..backends import backend_of
from ..backends.clients import LockAlias
from ..core.layout import KeyLayout
from .holds import Hold, HoldWatch
from .renewal import RenewedLease, renewer

__all__ = ["extended", "start", "stop"]

ReportLost = Callable[[Hold, str], None]


def start(
    hold: Hold, owner: object, alias: LockAlias, keys: KeyLayout, *, lease: float, renew: bool,
    sent_at: float, granted: float, title: str, state: threading.Lock, report_lost: ReportLost,
) -> None:  # fmt: skip
    """Keep ``hold`` alive if it needs it: renewed (``renew``), or a lease handed over short
    (``granted`` < ``lease``, by release.lua), lengthened once to the whole lease. Either way
    the watchdog makes its lease at its next look, if the hold is still held then (``defer``),
    and no later than a third of what was granted. ``title`` names it in the logs;
    ``report_lost(hold, reason)`` is told of a loss (a bound method of the primitive's
    bookkeeping, kept weakly once the lease is made)."""
    if renew or granted < lease:
        until = None if renew else sent_at + lease
        hold.young = True
        renewer.defer(
            hold, sent_at + min(granted, lease) / 3, _grown_up, hold, owner, alias, keys,
            lease, until, sent_at, granted, title, state, report_lost,
        )  # fmt: skip


def extended(hold: Hold, started: float, lease: float, state: threading.Lock) -> None:
    """``hold``'s lease was made to run ``lease`` seconds from ``started`` (``extend()``): a
    renewed lease is renewed from there; a lease of fixed length handed over short is no longer
    lengthened to its whole lease, which would undo the extension. (Under the primitive's lock,
    as the watchdog's :func:`_grown_up` reads it.)"""
    with state:
        hold.lease, hold.lease_ends_at = lease, started + lease
        renewal = hold.renewal
        if renewal is not None and renewal.until is not None:
            renewer.remove(renewal)
            hold.renewal = None
        elif renewal is not None:
            renewal.confirmed(started, lease)


def stop(hold: Hold, state: threading.Lock) -> None:
    """``hold`` is no longer to be renewed (released, lost, let go)."""
    if hold.young:
        with state:
            renewer.take_back(hold)
            hold.young = False
    if hold.renewal is not None:
        renewer.remove(hold.renewal)


def _grown_up(
    hold: Hold, owner: object, alias: LockAlias, keys: KeyLayout, lease: float,
    until: float | None, sent_at: float, granted: float, title: str, state: threading.Lock,
    report_lost: ReportLost,
) -> None:  # fmt: skip
    """On the watchdog's thread: a deferred hold outlived its look: its lease made from now on
    (renewed, or lengthened once ``until``), unless it ended meanwhile."""
    with state:
        if not renewer.take_back(hold):
            return  # (taken back by stop(): it ended)
        if hold.count > 0 and hold.releasing_since is None and hold.lost_reason is None:
            was_extended = hold.lease_ends_at != sent_at + granted  # (by extended())
            if was_extended and until is not None:
                return  # a lease of fixed length, lengthened by the extension: as it asked
            renewal = _lease(hold, owner, alias, keys, lease, until, title, report_lost)
            if was_extended:
                renewal.confirmed(hold.lease_ends_at - hold.lease, hold.lease)
            else:
                renewal.confirmed(sent_at, granted)
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
