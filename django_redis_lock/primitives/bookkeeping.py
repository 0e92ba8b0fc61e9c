"""What a leased primitive (``Lock``, ``Semaphore``) keeps between round trips: its options,
its holds (one per thread or task), their renewal, and what each outcome of the core's flows
means for them. Written once for the sync and the async API, which differ only in how they run
a flow (``leased.py``): a primitive *has* its bookkeeping, and asks it before and after each
round trip."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from ..backends.clients import LockAlias
from ..backends.wire import request_sent
from ..conf import lock_settings
from ..core import durations, flows, uncontended
from ..core.labels import group_of
from ..core.layout import KeyLayout
from ..exceptions import LockBackendError, LockError, LockLost, LockNotAcquired, LockNotOwned
from . import errors, owners, reports
from .background import renewal
from .claims import Claim, Pending, Step
from .contention import contention
from .holds import Hold
from .options import Options, resolve_options
from .own_tokens import own_tokens
from .owners import current_owner
from .reentrancy import reentrant_holds

__all__ = ["Bookkeeping", "Layout"]

logger = logging.getLogger("django_redis_lock")

# What a re-entry reads the time by (monotonic seconds, as a hold's lease end): a seam for the
# tests that move it past a lease.
lease_clock = time.monotonic

#: A primitive's keys (and scripts): ``layout(name, alias, quorum)`` (``keys.lock_keys`` for a
#: lock; a semaphore's differ).
Layout = Callable[[str, LockAlias, bool], KeyLayout]


class Bookkeeping:
    """The bookkeeping of one primitive object. It keeps the primitive weakly (the logs,
    signals and metrics name it), so that a primitive nobody holds on to is collected at once,
    and with it this: the watchdog then knows its holds can no longer be released."""

    def __init__(
        self, primitive: object, name: str, *, timeout: float | None, wait: float | None,
        auto_renew: bool | None, label: str | None, using: Any, group: str | None,
        layout: Layout, reentrant: bool = False, fencing: bool = False,
        job_id: str | None = None, guard: str | None = None, limit: int = 0, fair: bool = True,
    ) -> None:  # fmt: skip
        self._primitive = weakref.ref(primitive)
        # How the logs name it (after it was collected too).
        self._title = f"{type(primitive).__name__} {name!r}"
        self.name = name
        self.label = label
        self.timeout = timeout
        self.wait = wait
        self.auto_renew = auto_renew
        self.using = using
        self.given_group = group  # given (group=...): in the owner record too
        self.reentrant = reentrant
        self.fencing = fencing
        self.job_id = job_id
        self.guard = guard
        self.limit = limit  # a semaphore's permits; 0: a lock
        self.fair = fair
        self._layout = layout
        self._derived_group: str | None = None
        self._resolved: Options | None = None
        self._holds: weakref.WeakKeyDictionary[object, Hold] = weakref.WeakKeyDictionary()
        self._state = threading.Lock()
        # Set for good once a release through this object did not complete: from then on an
        # acquisition looks for one to finish first, which costs nothing until then.
        self.release_failed = False
        # fair=False: the waiter its latest release woke (first in line still, if it lost the
        # race), whom the next release expects: the script wakes it, not a round trip more.
        self._first_waiter = ""

    @property
    def reported(self) -> Any:
        """The primitive (what the logs, signals and metrics name; alive while it is used)."""
        return self._primitive()

    @property
    def group(self) -> str:
        """What the metrics count this under: ``group=``, else the name's leading parts."""
        if self.given_group is not None:
            return self.given_group
        if self._derived_group is None:
            self._derived_group = group_of(self.name)
        return self._derived_group

    # -- who holds what ------------------------------------------------------------------------

    def hold(self) -> Hold | None:
        return self.hold_of(current_owner())

    def hold_of(self, owner: object) -> Hold | None:
        # In a forked child, the parent's holds are still in memory, but not the child's:
        # the parent is still inside its critical section, so the child must not release
        # or renew its lease, nor re-enter it. A re-entrant hold another Lock object released
        # for good has no levels left.
        hold = self._holds.get(owner)
        return hold if hold is not None and hold.pid == owners.pid and hold.count > 0 else None

    def inherited(self, owner: object) -> bool:
        """Whether ``owner``'s hold is one a forked child inherited from its parent."""
        hold = self._holds.get(owner)
        return hold is not None and hold.pid != owners.pid

    def held_or_raise(self, owner: object | None = None) -> Hold:
        owner = current_owner() if owner is None else owner
        hold = self.hold_of(owner)
        if hold is None:
            forked = " (its parent process holds it, not this forked child)"
            raise LockNotOwned(
                f"Lock {self.name!r} is not held by this thread/task through this Lock object"
                f"{forked if self.inherited(owner) else ''}.",
                name=self.name,
            )
        return hold

    def options(self) -> Options:
        # Settings are read once, when the Lock is first used (then they are fixed for it).
        if self._resolved is None:
            self._resolved = resolve_options(
                self.name, using=self.using, timeout=self.timeout,
                auto_renew=self.auto_renew, wait=self.wait, label=self.label,
                guard=self.guard, layout=self._keys, group=self.given_group,
                plain=not (self.reentrant or self.fencing or self.limit or self.job_id),
            )  # fmt: skip
        return self._resolved

    def _keys(self, alias: LockAlias, quorum: bool) -> KeyLayout:
        """The keys (and scripts) of this primitive (``LockKeys``; a semaphore's differ)."""
        return self._layout(self.name, alias, quorum)

    def alias_and_keys(self) -> tuple[LockAlias, KeyLayout]:
        resolved = self.options()
        return resolved.alias, resolved.keys

    def backend_error(
        self, action: str, exc: BaseException, started: float | None = None
    ) -> LockBackendError:
        if started is not None:  # an acquisition's: how long it tried, for the metrics
            reports.acquire_failed(self.reported, time.monotonic() - started)
        return errors.backend_error(self.name, action, exc, lock_settings.REPLICA_TIMEOUT)

    # -- acquiring -----------------------------------------------------------------------------

    def prepare(self, wait: float | None, want_result: bool) -> Pending | Claim:
        """Everything an acquisition needs before its first round trip; a :class:`Claim`
        when it needs none (a re-entry, counted here)."""
        owner = current_owner()
        if wait is not None:
            wait = durations.seconds(wait, "wait", wait=True, allow_inf=True)
        resolved = self.options()
        hold = self.hold_of(owner)
        if hold is not None and not self.reentrant:
            raise LockError(
                f"Lock {self.name!r} is already held by this thread/task; "
                "use reentrant=True to acquire it again.",
                name=self.name,
            )
        if self.reentrant:
            hold = hold or reentrant_holds.get(owner, resolved.keys.lease)
            if hold is not None and hold.pid == owners.pid and hold.count > 0:
                return self._reentered(owner, hold)
        started = time.monotonic()
        return resolved.acquisition(
            owner, wait=wait, want_result=want_result, fencing=self.fencing, limit=self.limit,
            job_id=self.job_id, started=started, on_contended=self.contended, fair=self.fair,
            first=self._first_try(
                resolved.keys.lease, started, want_result, resolved.replicas, resolved.quorum
            ),
        )  # fmt: skip

    def _reentered(self, owner: object, hold: Hold) -> Claim:
        if hold.lost_reason is None and hold.may_have_ended(lease_clock()):
            # Its lease has ended by our own clock (not renewed, or no longer): someone else
            # may hold the lock now, and a level more of it would guard nothing.
            self.report_lost(hold, "its lease had ended before it was re-entered")
        if hold.lost_reason is not None:
            raise self.lost_error(hold)
        with self._state:
            hold.count += 1
            self._holds[owner] = hold
        reports.acquired(self.reported, 0.0, hold.fence)
        return Claim(True)

    def _first_try(
        self, key: str, now: float, want_result: bool, replicas: int, quorum: bool
    ) -> str:
        """How an acquisition starts (see ``flows.acquire``)."""
        if replicas or (not quorum and self.contended_lately(key, now)):
            return "join"
        if self.fencing or want_result or self.limit:
            return "take"  # (a semaphore's permit: always a script)
        return "set"

    def contended(self, plan: flows.AcquirePlan, holder: Any) -> None:
        """An acquisition through this object has to wait (``AcquirePlan.on_contended``)."""
        contention.saw(plan.keys.lease, time.monotonic())
        reports.contended(self.reported, plan.max_wait, holder)

    def contended_lately(self, key: str, now: float) -> bool:
        """Whether an acquisition of this lock (lease ``key``) in this process had to wait
        lately: the next one joins the queue at once (``contention.py``). Never for a lock
        taken with fair=False: its releases leave it free for whoever asks first, so a bare SET
        is the best first try, busy or not."""
        return self.fair and contention.lately(key, now)

    # -- what an acquisition's outcome means ---------------------------------------------------

    def settled(self, pending: Pending, outcome: Any) -> Claim:
        """What an acquisition's outcome means for us."""
        if isinstance(outcome, flows.Acquired):
            plan = pending.plan
            self.took(
                pending.owner, pending.alias, plan.keys, plan.token, plan.started,
                pending.lease, pending.renew, outcome, plan.limit,
            )  # fmt: skip
            return Claim(True)
        if isinstance(outcome, flows.Done):
            reports.done_elsewhere(self.reported, time.monotonic() - pending.plan.started)
            return Claim(False, result=outcome.result)
        contention.saw(pending.plan.keys.lease, time.monotonic())
        max_wait = pending.plan.max_wait
        reports.gave_up(self.reported, max_wait)
        refusal = LockNotAcquired(
            self.name,
            ttl=outcome.pttl / 1000 if outcome.pttl > 0 else None,
            owner=reports.owner_of(outcome.holder, self.name),
            waited=max_wait,
            # (Through another Lock object: one that is not re-entrant waits for itself.)
            by_caller=not self.limit and own_tokens.holds(pending.owner, outcome.holder),
        )
        return Claim(False, refusal=refusal)

    def took(
        self, owner: object, alias: LockAlias, keys: KeyLayout, token: str, started: float,
        lease: float, renew: bool, outcome: flows.Acquired, limit: int = 0,
    ) -> None:  # fmt: skip
        """``owner`` holds it from now on, by ``outcome`` of an acquisition started at
        ``started``: kept, renewed and reported (after the flows, or the flat path's
        ``uncontended.settled``)."""
        now = time.monotonic()
        granted = outcome.lease_ms / 1000
        fence = outcome.fence if self.fencing else None
        hold = Hold(token, fence, now, lease, outcome.sent_at + granted, owners.pid)
        hold.next_token = outcome.next_token
        renewal.start(
            hold, owner, alias, keys, lease=lease, renew=renew, sent_at=outcome.sent_at,
            granted=granted, title=self._title, state=self._state, report_lost=self.report_lost,
        )  # fmt: skip
        with self._state:
            self._holds[owner] = hold
        own_tokens.add(token, owner)
        if self.reentrant:
            reentrant_holds.set(owner, keys.lease, hold, self)
        if outcome.other_limit:
            reports.limits_differ(self.reported, limit, outcome.other_limit)
        reports.acquired(self.reported, now - started, hold.fence)

    # -- releasing and extending ---------------------------------------------------------------

    def release_step(self, result: bytes | None, result_ttl: float) -> Step:
        owner = current_owner()
        hold = self.held_or_raise(owner)
        alias, keys = self.alias_and_keys()
        if hold.count > 1 and hold.releasing_since is None:
            with self._state:  # an inner level of a re-entrant lock: counted here only
                hold.count -= 1
            return Step(owner, alias, keys, hold)
        # A try that failed (or was cancelled) may have got through before its reply was
        # lost: a retry must not call the lease lost (_released).
        if hold.releasing_since is None:
            hold.releasing_since = time.monotonic()
        earlier_ran = hold.release_may_have_run
        hold.release_may_have_run = True  # until this try says otherwise (a cancel cannot)
        renewal.stop(hold, self._state)  # the work is done: renewing now could only mislead
        keep = hold.releasing_with  # (a retry of a release that kept a result keeps it too)
        if result is not None:
            keep = hold.releasing_with = (result, durations.milliseconds(result_ttl))
        request = uncontended.release_request(
            keys, hold.token, hold.next_token or self._first_waiter, keep,
            unfair_ms=0 if self.fair else uncontended.STARVATION_BOUND_MS,
        )  # fmt: skip
        return Step(owner, alias, keys, hold, earlier_ran=earlier_ran, request=request)

    def release_failure(self, step: Step, exc: BaseException) -> LockBackendError:
        self.release_failed = True
        if isinstance(exc, RedisError):
            step.hold.release_may_have_run = step.earlier_ran or request_sent(exc)
        return self.backend_error("release", exc)

    def unsettled(self) -> Step | None:
        """A release of this owner's hold that failed and was never retried. A new
        acquisition finishes it first: the work it ended is over, and re-entering a hold whose
        lease may be gone, and is no longer renewed, would be holding nothing."""
        hold = self.hold()
        return None if hold is None or hold.releasing_since is None else self.release_step(None, 0)

    def released(self, step: Step, code: int, first: str = "") -> None:
        """A release's ``code`` (``drivers.release``); ``first``: whom it handed to or woke."""
        if not self.fair:
            self._first_waiter = first
        owner, keys, hold = step.owner, step.keys, step.hold
        releasing_since, hold.releasing_since = hold.releasing_since, None
        hold.release_may_have_run, hold.releasing_with = False, ()
        if (
            code == -1
            and step.earlier_ran
            and hold.lost_reason is None
            and releasing_since is not None
            and not hold.may_have_ended(releasing_since)
        ):
            # An earlier try was sent while the lease still ran, and its reply was lost: it
            # went through, or the lease ended after the work under it had, so nobody
            # overlapped us. (Unless someone deleted the lease meanwhile and that try never
            # reached Redis: a loss we cannot tell from a lost reply, see docs/locks.md.)
            code = 0
            logger.debug("Lock %r: an earlier try of this release got through", self.name)
        if code < 0:
            self._forget(owner, keys, hold)
            self.report_lost(hold, "its lease had ended before it was released")
            raise LockNotOwned(
                f"Lock {self.name!r} was no longer ours to release: its lease had ended "
                "(and someone else may hold it now). Nothing was deleted.",
                name=self.name,
            )
        with self._state:
            hold.count = 0
        self._forget(owner, keys, hold)
        reports.released(self.reported, time.monotonic() - hold.acquired_at)

    def extend_step(self, seconds: float | None) -> Step:
        owner = current_owner()
        hold = self.held_or_raise(owner)
        if seconds is None:
            lease = self.options().lease
        else:
            lease = durations.seconds(seconds, "extend(seconds)")
        alias, keys = self.alias_and_keys()
        flow = flows.extend(keys, hold.token, durations.milliseconds(lease))
        return Step(owner, alias, keys, hold, flow=flow, lease=lease, started=time.monotonic())

    def extended(self, step: Step, extended: bool) -> None:
        hold = step.hold
        if not extended:
            self._forget(step.owner, step.keys, hold)
            self.report_lost(hold, "its lease had ended before it was extended")
            raise LockNotOwned(f"Lock {self.name!r} was no longer ours to extend.", name=self.name)
        renewal.extended(hold, step.started, step.lease, self._state)

    def let_go(self, owner: object, hold: Hold) -> None:
        """``owner`` no longer holds ``hold`` here, while its lease lives on (``detach``)."""
        with self._state:
            hold.count = 0
        self._forget(owner, self.options().keys, hold)
        logger.debug("Detached from lock %r: its lease runs on", self.name)

    def _forget(self, owner: object, keys: KeyLayout, hold: Hold) -> None:
        own_tokens.discard(hold.token)
        renewal.stop(hold, self._state)
        with self._state:
            if self._holds.get(owner) is hold:
                del self._holds[owner]
        if self.reentrant:
            reentrant_holds.forget(owner, keys.lease, hold)

    # -- losses and errors ---------------------------------------------------------------------

    def report_lost(self, hold: Hold, reason: str) -> None:
        """Make a loss loud, once: ERROR log, ``lock_lost`` signal, ``lock.lost``."""
        with self._state:
            if hold.lost_reason is not None:
                return
            hold.lost_reason = reason
        renewal.stop(hold, self._state)
        reports.lost(self.reported, time.monotonic() - hold.acquired_at, reason)

    def lost_error(self, hold: Hold) -> LockLost:
        return errors.lost_error(self.name, hold.lost_reason)

    def exit_error(self, hold: Hold | None, exc: BaseException | None, error: LockError) -> None:
        """A release at the end of a ``with`` block failed: ``errors.exit_error``."""
        errors.exit_error(self.name, hold, exc, error)
