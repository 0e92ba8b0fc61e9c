"""What a primitive (``Lock``, ``Semaphore``) keeps between round trips: its settings, its holds
(one per thread or task), their renewal, and what each outcome of the core's flows means for
them. Written once for the sync and the async API, which differ only in how they run a flow
(``primitive.py``)."""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from typing import Any

from redis.exceptions import RedisError

from ..backends import Backend, backend_of
from ..backends.clients import LockAlias
from ..backends.wire import request_sent
from ..conf import lock_settings
from ..core import durations, flows
from ..core.labels import group_of
from ..core.lease import held_by, takeover_prefixes
from ..exceptions import LockBackendError, LockError, LockLost, LockNotAcquired, LockNotOwned
from . import holds, reports
from .claims import Claim, Pending, Resolved, Step, resolve
from .holds import Hold, HoldWatch, current_owner, own_tokens, reentrant_holds, strays
from .keys import LockKeys, lock_keys
from .renewal import RenewedLease, renewer

__all__ = ["Holding"]

logger = logging.getLogger("django_redis_lock")

# What a re-entry reads the time by (monotonic seconds, as a hold's lease end): a seam for the
# tests that move it past a lease.
lease_clock = time.monotonic

# How long after an acquisition had to wait the next one through the same object joins the
# queue at once (one round trip saved per acquisition of a busy lock).
_CONTENDED_MEMORY = 1.0


class Holding:
    """The bookkeeping half of a leased primitive, ``Lock`` or ``Semaphore`` (its attributes
    are set by ``primitive.Leased._set_up``)."""

    _name: str
    _label: str | None
    _timeout: float | None
    _wait: float | None
    _auto_renew: bool | None
    _reentrant: bool
    _fencing: bool
    _job_id: str | None
    _guard: str | None
    _using: Any
    _resolved: Resolved | None
    _holds: weakref.WeakKeyDictionary[object, Hold]
    _state: threading.Lock
    _release_failed: bool
    _contended_at: float
    _limit: int = 0  # a semaphore's permits; 0: a lock
    _group: str | None = None  # given (group=...): written in the owner record too
    _derived_group: str | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def label(self) -> str | None:
        return self._label

    @property
    def group(self) -> str:
        """What the metrics count this under: ``group=``, else the name's leading parts."""
        if self._group is not None:
            return self._group
        if self._derived_group is None:
            self._derived_group = group_of(self._name)
        return self._derived_group

    # -- who holds what ------------------------------------------------------------------------

    def _hold(self) -> Hold | None:
        return self._hold_of(current_owner())

    def _hold_of(self, owner: object) -> Hold | None:
        # In a forked child, the parent's holds are still in memory, but not the child's:
        # the parent is still inside its critical section, so the child must not release
        # or renew its lease, nor re-enter it. A re-entrant hold another Lock object released
        # for good has no levels left.
        hold = self._holds.get(owner)
        return hold if hold is not None and hold.pid == holds.pid and hold.count > 0 else None

    def _inherited(self, owner: object) -> bool:
        """Whether ``owner``'s hold is one a forked child inherited from its parent."""
        hold = self._holds.get(owner)
        return hold is not None and hold.pid != holds.pid

    def _held_or_raise(self, owner: object | None = None) -> Hold:
        owner = current_owner() if owner is None else owner
        hold = self._hold_of(owner)
        if hold is None:
            forked = " (its parent process holds it, not this forked child)"
            raise LockNotOwned(
                f"Lock {self._name!r} is not held by this thread/task through this Lock object"
                f"{forked if self._inherited(owner) else ''}.",
                name=self._name,
            )
        return hold

    def _resolve(self) -> Resolved:
        # Settings are read once, when the Lock is first used (then they are fixed for it).
        if self._resolved is None:
            self._resolved = resolve(
                self._name, using=self._using, timeout=self._timeout,
                auto_renew=self._auto_renew, wait=self._wait, label=self._label,
                guard=self._guard, layout=self._layout, group=self._group,
            )  # fmt: skip
        return self._resolved

    def _layout(self, alias: LockAlias, quorum: bool) -> Any:
        """The keys (and scripts) of this primitive (``LockKeys``; a semaphore's differ)."""
        return lock_keys(self._name, alias)

    def _alias_and_keys(self) -> tuple[LockAlias, LockKeys]:
        resolved = self._resolve()
        return resolved.alias, resolved.keys

    def _backend_error(
        self, action: str, exc: BaseException, started: float | None = None
    ) -> LockBackendError:
        if started is not None:  # an acquisition's: how long it tried, for the metrics
            reports.acquire_failed(self, time.monotonic() - started)
        return reports.backend_error(self._name, action, exc, lock_settings.REPLICA_TIMEOUT)

    # -- acquiring -----------------------------------------------------------------------------

    def _prepare(self, wait: float | None, want_result: bool) -> Pending | Claim:
        """Everything an acquisition needs before its first round trip; a :class:`Claim`
        when it needs none (a re-entry, counted here)."""
        owner = current_owner()
        if wait is not None:
            wait = durations.seconds(wait, "wait", wait=True, allow_inf=True)
        resolved = self._resolve()
        hold = self._hold_of(owner)
        if hold is not None and not self._reentrant:
            raise LockError(
                f"Lock {self._name!r} is already held by this thread/task; "
                "use reentrant=True to acquire it again.",
                name=self._name,
            )
        if self._reentrant:
            hold = hold or reentrant_holds.get(owner, resolved.keys.lease)
            if hold is not None and hold.pid == holds.pid and hold.count > 0:
                return self._reentered(owner, hold)
        quorum, replicas = resolved.quorum, resolved.replicas
        started = time.monotonic()
        plan = flows.AcquirePlan(
            keys=resolved.keys,
            token=holds.new_token() if self._job_id is None else holds.job_token(self._job_id),
            lease_ms=durations.milliseconds(resolved.lease),
            record=resolved.records.encoded(owner, resolved.lease),
            max_wait=resolved.wait if wait is None else wait,
            clock=time.monotonic,
            first=self._first_try(started, want_result, replicas, quorum),
            queues=not quorum,
            fencing=self._fencing,
            limit=self._limit,
            want_result=want_result,
            job=self._job_id is not None,
            takeover=() if self._job_id is None else takeover_prefixes(self._job_id),
            report_holder=reports.contention_observed,
            on_contended=self._contended,
            retry_soon=Backend.retry_soon,
            unreachable=Backend.unreachable,
            replicas=replicas,
            replica_timeout_ms=resolved.replica_timeout_ms,
            started=started,
            strays=strays.take(resolved.keys.lease, started),
            strayed=strays.left,
        )
        return Pending(owner, resolved.alias, plan, resolved.lease, resolved.renew)

    def _reentered(self, owner: object, hold: Hold) -> Claim:
        if (
            hold.lost_reason is None
            and lease_clock() >= hold.ends_at() - durations.clock_allowance(hold.lease)
        ):
            # Its lease has ended by our own clock (not renewed, or no longer): someone else
            # may hold the lock now, and a level more of it would guard nothing.
            self._report_lost(hold, "its lease had ended before it was re-entered")
        if hold.lost_reason is not None:
            raise self._lost_error(hold)
        with self._state:
            hold.count += 1
            self._holds[owner] = hold
        reports.acquired(self, 0.0, hold.fence)
        return Claim(True)

    def _first_try(self, now: float, want_result: bool, replicas: int, quorum: bool) -> str:
        """How an acquisition starts (see ``flows.acquire``)."""
        if replicas or (not quorum and now - self._contended_at < _CONTENDED_MEMORY):
            return "join"
        if self._fencing or want_result or self._limit:
            return "take"  # (a semaphore's permit: always a script)
        return "set"

    def _contended(self, plan: flows.AcquirePlan, holder: Any) -> None:
        self._contended_at = time.monotonic()
        reports.contended(self, plan.max_wait, holder)

    def _settled(self, pending: Pending, outcome: Any) -> Claim:
        """What an acquisition's outcome means for us."""
        if isinstance(outcome, flows.Acquired):
            self._acquired(pending, outcome)
            return Claim(True)
        if isinstance(outcome, flows.Done):
            return Claim(False, result=outcome.result)
        self._contended_at = time.monotonic()
        max_wait = pending.plan.max_wait
        reports.gave_up(self, max_wait)
        refusal = LockNotAcquired(
            self._name,
            ttl=outcome.pttl / 1000 if outcome.pttl > 0 else None,
            owner=reports.owner_of(outcome.holder, self._name),
            waited=max_wait,
            # (Through another Lock object: one that is not re-entrant waits for itself.)
            by_caller=not self._limit and own_tokens.holds(pending.owner, outcome.holder),
        )
        return Claim(False, refusal=refusal)

    def _acquired(self, pending: Pending, outcome: flows.Acquired) -> None:
        owner, plan, lease = pending.owner, pending.plan, pending.lease
        now = time.monotonic()
        granted = outcome.lease_ms / 1000
        fence = outcome.fence if self._fencing else None
        hold = Hold(plan.token, fence, now, lease, outcome.sent_at + granted, holds.pid)
        hold.next_token = outcome.next_token
        if pending.renew or granted < lease:
            # Renewed, or a lease handed over short (release.lua) that is lengthened once:
            # weakly, so that a lease nobody can release any more is not renewed for ever.
            watch = HoldWatch(hold, owner, self._report_lost)
            hold.renewal = RenewedLease(
                client=backend_of(pending.alias).client,
                key=plan.keys.lease,
                token=plan.token,
                lease=lease,
                on_lost=watch.lost,
                name=f"{type(self).__name__} {self._name!r}",
                abandoned=watch.abandoned,
                until=None if pending.renew else outcome.sent_at + lease,
                script=plan.keys.EXTEND,
                keys=plan.keys.extend_keys(),
            )
            hold.renewal.confirmed(outcome.sent_at, granted)
            renewer.add(hold.renewal)
        with self._state:
            self._holds[owner] = hold
        own_tokens.add(plan.token, owner)
        if self._reentrant:
            reentrant_holds.set(owner, plan.keys.lease, hold, self)
        if outcome.other_limit:
            reports.limits_differ(self, plan.limit, outcome.other_limit)
        reports.acquired(self, now - plan.started, hold.fence)

    # -- releasing and extending ---------------------------------------------------------------

    def _release_step(self, result: bytes | None, result_ttl: float) -> Step:
        owner = current_owner()
        hold = self._held_or_raise(owner)
        alias, keys = self._alias_and_keys()
        if hold.count > 1 and hold.releasing_since is None:
            with self._state:  # an inner level of a re-entrant lock: counted here only
                hold.count -= 1
            return Step(owner, alias, keys, hold, None)
        # A try that failed (or was cancelled) may have got through before its reply was
        # lost: a retry must not call the lease lost (_released).
        if hold.releasing_since is None:
            hold.releasing_since = time.monotonic()
        earlier_ran = hold.release_may_have_run
        hold.release_may_have_run = True  # until this try says otherwise (a cancel cannot)
        if hold.renewal is not None:
            renewer.remove(hold.renewal)  # the work is done: renewing now could only mislead
        keep: dict[str, Any] = {}
        if result is not None:
            keep = {"result": result, "result_ttl_ms": durations.milliseconds(result_ttl)}
        flow = flows.release(keys, hold.token, hold.next_token, **keep)
        return Step(owner, alias, keys, hold, flow, earlier_ran)

    def _release_failure(self, step: Step, exc: BaseException) -> LockBackendError:
        self._release_failed = True
        if isinstance(exc, RedisError):
            step.hold.release_may_have_run = step.earlier_ran or request_sent(exc)
        return self._backend_error("release", exc)

    def _unsettled(self) -> Step | None:
        """A release of this owner's hold that failed and was never retried. A new
        acquisition finishes it first: the work it ended is over, and re-entering a hold whose
        lease may be gone, and is no longer renewed, would be holding nothing."""
        hold = self._hold()
        return (
            None if hold is None or hold.releasing_since is None else self._release_step(None, 0)
        )

    def _released(self, step: Step, code: int) -> None:
        owner, keys, hold = step.owner, step.keys, step.hold
        releasing_since, hold.releasing_since = hold.releasing_since, None
        hold.release_may_have_run = False
        if (
            code == -1
            and step.earlier_ran
            and hold.lost_reason is None
            and releasing_since is not None
            and releasing_since < hold.ends_at() - durations.clock_allowance(hold.lease)
        ):
            # An earlier try was sent while the lease still ran, and its reply was lost: it
            # went through, or the lease ended after the work under it had, so nobody
            # overlapped us. (Unless someone deleted the lease meanwhile and that try never
            # reached Redis: a loss we cannot tell from a lost reply, see docs/locks.md.)
            code = 0
            logger.debug("Lock %r: an earlier try of this release got through", self._name)
        if code < 0:
            self._forget(owner, keys, hold)
            self._report_lost(hold, "its lease had ended before it was released")
            raise LockNotOwned(
                f"Lock {self._name!r} was no longer ours to release: its lease had ended "
                "(and someone else may hold it now). Nothing was deleted.",
                name=self._name,
            )
        with self._state:
            hold.count = 0
        self._forget(owner, keys, hold)
        reports.released(self, time.monotonic() - hold.acquired_at)

    def _extend_step(self, seconds: float | None) -> Step:
        owner = current_owner()
        hold = self._held_or_raise(owner)
        if seconds is None:
            lease = self._resolve().lease
        else:
            lease = durations.seconds(seconds, "extend(seconds)")
        alias, keys = self._alias_and_keys()
        flow = flows.extend(keys, hold.token, durations.milliseconds(lease))
        return Step(owner, alias, keys, hold, flow, lease=lease, started=time.monotonic())

    def _extended(self, step: Step, extended: bool) -> None:
        hold = step.hold
        if not extended:
            self._forget(step.owner, step.keys, hold)
            self._report_lost(hold, "its lease had ended before it was extended")
            raise LockNotOwned(
                f"Lock {self._name!r} was no longer ours to extend.", name=self._name
            )
        hold.lease, hold.lease_ends_at = step.lease, step.started + step.lease
        if hold.renewal is not None:
            hold.renewal.confirmed(step.started, step.lease)

    def _let_go(self, owner: object, hold: Hold) -> None:
        """``owner`` no longer holds ``hold`` here, while its lease lives on (``detach``)."""
        with self._state:
            hold.count = 0
        self._forget(owner, self._resolve().keys, hold)
        logger.debug("Detached from lock %r: its lease runs on", self._name)

    def _forget(self, owner: object, keys: LockKeys, hold: Hold) -> None:
        own_tokens.discard(hold.token)
        if hold.renewal is not None:
            renewer.remove(hold.renewal)
        with self._state:
            if self._holds.get(owner) is hold:
                del self._holds[owner]
        if self._reentrant:
            reentrant_holds.forget(owner, keys.lease, hold)

    # -- losses and errors ---------------------------------------------------------------------

    def _report_lost(self, hold: Hold, reason: str) -> None:
        """Make a loss loud, once: ERROR log, ``lock_lost`` signal, ``lock.lost``."""
        with self._state:
            if hold.lost_reason is not None:
                return
            hold.lost_reason = reason
        if hold.renewal is not None:
            renewer.remove(hold.renewal)
        reports.lost(self, time.monotonic() - hold.acquired_at, reason)

    def _lost_error(self, hold: Hold) -> LockLost:
        return LockLost(
            f"Lock {self._name!r} was lost while held: {hold.lost_reason}.", name=self._name
        )

    def _exit_error(self, hold: Hold | None, exc: BaseException | None, error: LockError) -> None:
        """A release at the end of a ``with`` block failed: say so without hiding ``exc``."""
        if exc is not None:
            logger.exception("Could not release lock %r after an error", self._name)
        elif isinstance(error, LockNotOwned) and hold is not None:
            raise self._lost_error(hold) from error
        else:
            raise error

    # -- reads ---------------------------------------------------------------------------------

    @staticmethod
    def _holds_token(value: Any, hold: Hold) -> bool:
        return held_by(value, hold.token)

    def _seconds_left(self, pttl: Any) -> float | None:
        milliseconds = int(pttl)
        if milliseconds == -1:
            logger.warning(
                "Lock %r: its key %s never expires", self._name, self._resolve().keys.lease
            )
            return math.inf
        return milliseconds / 1000 if milliseconds >= 0 else None
