"""The watchdog: one daemon thread per process that keeps held leases alive.

A lock taken without an explicit ``timeout`` gets a short lease (``DJANGO_REDIS_LOCK_TIMEOUT``)
that is renewed here at about a third of its length, so a holder that dies frees the lock within
one lease while a long job keeps it (Redisson's watchdog). Leases are renewed in batches: when
one falls due, every lease due within a sixth of its length joins it, so leases renewed together
stay together (a lease whose renewal failed is retried on its own schedule). A batch is one
round trip per Redis client (per node of a Redis Cluster): on one server, one script call per
thousand leases (the backend's ``renew``, ``backends/renewal.py``).

Nothing is lost silently: a renewal that finds the lease gone (expired, deleted, force-released)
calls the lease's ``on_lost``; so does a renewal that could not reach Redis before the lease
would have ended. The lock turns that into ``lock.lost``, ``LockLost``, an ERROR log and the
``lock_lost`` signal.

How a hold joins the watchdog (:func:`start`, :func:`extended`, :func:`stop`): a hold's lease
(renewed, or a short one handed over to be lengthened) is made only if the hold outlives the
watchdog's next look (``defer``): most holds end long before a third of their lease, and then
keeping them alive cost a dict entry and nothing more. The look (:func:`_grown_up`, on the
watchdog's thread) and the hold's end (:func:`stop`) each take the deferral back under the
primitive's lock: exactly one of them gets it, so a hold that ended is never renewed, and one that
lives on always is.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ...backends import backend_for, backend_of
from ...backends.clients import LockAlias
from ...core.durations import readable
from ...core.layout import KeyLayout
from ...core.renewal import RenewedLease, Schedule
from ..holds import Hold, HoldWatch

__all__ = ["RenewedLease", "Renewer", "extended", "renewer", "start", "stop"]

logger = logging.getLogger("django_redis_lock")

ReportLost = Callable[[Hold, str], None]

# With no lease to renew, the thread still looks this often for a while (up to _IDLE_LOOKS
# times), so that a process taking and releasing locks over and over (each released before its
# first renewal) does not wake it on every acquisition; then it sleeps until told.
_IDLE_LOOK = 1.0
_IDLE_LOOKS = 60


class Renewer:
    """Runs the :class:`Schedule` on a daemon thread (its clock: ``clock``, monotonic), and
    each client's batch of renewals on a thread of its own. The process has one,
    :data:`renewer`; a simulation (``tests/simulation/``) makes one per simulated process, on
    its clock, with ``at_fork=False``."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, at_fork: bool = True
    ) -> None:
        self.clock = clock
        self.reset()
        if at_fork:
            os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        """Forget every lease and the thread: after fork the thread is gone and the leases are
        the parent's, not ours. Only for a process that starts anew (a forked child, a
        simulated process): a running thread would go on beside the next one."""
        self._condition = threading.Condition()
        # An acquisition only adds its lease to the schedule and its release takes it out
        # (no lock taken, no thread woken), so most holds end before the watchdog ever looks
        # at them, and it only ever looks at the leases held now.
        self.schedule = Schedule()
        # The holds whose lease is made at the thread's next look (defer): id -> how.
        self.young: dict[int, tuple[Callable[..., None], tuple[Any, ...]]] = {}
        self._thread: threading.Thread | None = None
        # When the thread will next look (None: it is busy, or waits for a first lease).
        self._wakes_at: float | None = None
        self._idle_looks = 0

    def add(self, lease: RenewedLease) -> None:
        self.schedule.add(lease)
        self._look_by(lease.due)

    def defer(self, hold: object, due: float, grow: Callable[..., None], *args: Any) -> None:
        """A hold taken just now, whose lease (renewed, or a short handed one to lengthen) is
        made only if it outlives the thread's next look (most holds are released long before a
        third of their lease): then, on the thread, ``grow(*args)`` makes it and adds it (or,
        should it have ended meanwhile, does nothing). ``due``: when its first renewal falls
        due. The holder takes it back with :meth:`take_back`, under the same lock ``grow``
        makes it under."""
        self.young[id(hold)] = (grow, args)
        self._look_by(due)

    def take_back(self, hold: object) -> bool:
        """Forget ``hold``'s deferred lease (see :meth:`defer`): False when there was none,
        or the thread has made it already (then ``hold.renewal`` is it)."""
        return self.young.pop(id(hold), None) is not None

    def _look_by(self, due: float) -> None:
        # Waking the thread costs more than the whole acquire; only do it when this lease
        # falls due before the thread would look anyway (or there is no thread yet).
        wakes_at = self._wakes_at
        if wakes_at is None or due < wakes_at or self._thread is None:
            with self._condition:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="django-redis-lock-renewal", daemon=True
                    )
                    self._thread.start()
                self._condition.notify()

    def remove(self, lease: RenewedLease) -> None:
        self.schedule.remove(lease)

    def __contains__(self, lease: RenewedLease) -> bool:
        return lease.active

    def renewing(self, hold: Any) -> bool:
        """Whether ``hold`` (``holds.Hold``) is kept alive here: its lease deferred to the
        next look, or made and in the schedule."""
        return id(hold) in self.young or (hold.renewal is not None and hold.renewal.active)

    def _run(self) -> None:
        schedule = self.schedule
        while True:
            with self._condition:
                while True:
                    self._grow_young()
                    now = self.clock()
                    added = schedule.added
                    found = schedule.look(now)
                    if found.ended or found.abandoned or found.batches:
                        self._wakes_at = None
                        break
                    self._wakes_at = schedule.next_look()
                    if self._wakes_at is None and self._idle_looks < _IDLE_LOOKS:
                        self._idle_looks += 1
                        self._wakes_at = now + _IDLE_LOOK
                    elif self._wakes_at is not None and schedule.leases:
                        self._idle_looks = 0
                    if schedule.added != added or self.young:
                        # Added meanwhile, without telling us (add() saw an earlier _wakes_at
                        # than the one just set): look at it before sleeping.
                        continue
                    self._condition.wait(None if self._wakes_at is None else self._wakes_at - now)
            for lease, reason in found.abandoned:
                logger.warning(
                    "%s was acquired and never released: %s. It is no longer renewed, so "
                    "it frees when its lease ends (%s at most).",
                    lease.name, reason, readable(lease.lease),
                )  # fmt: skip
            for lease in found.ended:
                lease.on_lost(lease.unrenewed())
            for client_id, leases in found.batches.items():
                threading.Thread(
                    target=self._renew_batch,
                    args=(client_id, leases),
                    name="django-redis-lock-renewal-batch",
                    daemon=True,
                ).start()

    def _grow_young(self) -> None:
        """Make the lease of every deferred hold still held (each ``grow`` pops its own entry,
        under its holder's lock)."""
        for key, (grow, args) in list(self.young.items()):
            try:
                grow(*args)
            except Exception:  # the watchdog must never die
                self.young.pop(key, None)
                logger.exception("django-redis-lock: could not start renewing a lease")

    def _renew_batch(self, client_id: int, leases: list[RenewedLease]) -> None:
        client = leases[0].client
        sent_at = self.clock()
        lengths = [lease.milliseconds(sent_at) for lease in leases]
        try:
            # Sentinel: renew where the primary is now. After a failover the old primary is
            # demoted only at Sentinel's next check (about 10 s); until then pooled
            # connections would renew the lease there while it runs out on the new one (one
            # query to a Sentinel per renewal round).
            backend = backend_for(client)
            backend.follow_primary()
            results = backend.renew(leases, lengths)
        except Exception as exc:
            # Whatever it was, these leases were not renewed: retried until they would end,
            # then reported lost (never left due, which would spin the watchdog).
            results = [exc] * len(leases)
        lost: list[tuple[RenewedLease, str]] = []
        with self._condition:
            try:
                lost, retried = self.schedule.finished(
                    client_id, leases, results, lengths, sent_at, self.clock()
                )
            except Exception:  # the watchdog must never die
                self.schedule.busy.discard(client_id)
                logger.exception("django-redis-lock: renewal failed unexpectedly")
                retried = []
            self._condition.notify()
        for lease in retried:
            logger.warning(
                "django-redis-lock: could not renew %s (%s); retrying", lease.key, lease.failure
            )
        for lease, reason in lost:
            lease.on_lost(reason)


renewer = Renewer()


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
