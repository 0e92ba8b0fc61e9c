"""``Lock``: a distributed lock on Redis with a finite lease, an owner token and fair waiting.

    with Lock("reports:nightly", label="nightly report") as held:
        ...                                   # renewed in the background while inside

    lock = Lock("import:42", timeout=30, wait=0)
    if lock.acquire():                        # -> bool, does not block with wait=0
        try: ...
        finally: lock.release()               # only ever deletes our own lease

Nothing touches Redis until the first acquire. Each acquire, release and extend is one round
trip (one ``EVALSHA``, see ``scripts.py``, sent as ``commands.py`` says); a waiter blocks
server-side on its own wake-up list and is woken by the release, first come first served. A
``Lock`` object may be shared between threads and asyncio tasks: each holds (and may release)
only its own acquisition.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import durations, holds, signals
from .commands import (
    adrop_stale_connections,
    await_wake,
    drop_stale_connections,
    execute,
    request_sent,
    wait_for_wake,
)
from .conf import lock_settings
from .connection import LockAlias, async_lock_client, lock_client
from .exceptions import LockBackendError, LockError, LockLost, LockNotAcquired, LockNotOwned
from .holds import Hold, HoldWatch, current_owner, owner_description, reentrant_tokens
from .keys import LockKeys, lock_keys
from .quorum import AsyncQuorumClient, QuorumClient
from .quorum import members as checked_quorum
from .renewal import RenewedLease, renewer
from .scripts import ACQUIRE, EXTEND, RELEASE, Script

__all__ = ["Lock"]

logger = logging.getLogger("django_redis_lock")

# The longest single block on a wake-up list. Bounds how long a waiter that died unannounced
# can hold up the queue (its liveness deadline is one block plus _LIVENESS_SLACK), and makes a
# long wait re-check now and then instead of trusting one signal for minutes.
_BLOCK_CAP = 2.0
_LIVENESS_SLACK = 1.0
# Below this, a wait is not worth a blocking call: BLPOP's timeout 0 would mean "for ever".
_MIN_BLOCK = 0.001
# The least time an acquisition gives Redis to answer one request, however short its wait: a
# busy server is not a dead one. (Shorter socket timeouts still apply.)
_REPLY_FLOOR = 1.0

_HOST = socket.gethostname()

# acquire() modes understood by the ACQUIRE script.
_TRY, _QUEUE, _LEAVE_OR_TAKE, _LEAVE = 0, 1, 2, 3


def _granted(result: Any) -> bool:
    return bool(result[0] == 1)


@dataclass(frozen=True)
class _Resolved:
    """What a Lock takes from the settings, on first use."""

    alias: LockAlias
    keys: LockKeys
    lease: float
    renew: bool
    wait: float


@dataclass
class _Attempt:
    """What a failed call of the ACQUIRE script answered."""

    wait_hint: float = 0.0  # seconds until it is worth looking again
    owner: dict[str, Any] | None = None


@dataclass(eq=False)
class _Call:
    """One script call of release or extend, runnable sync or async: the I/O is the only
    difference, so what surrounds it is written once."""

    script: Script
    alias: LockAlias
    keys: list[str]
    args: list[Any]
    done: Callable[[Any], Any]
    failed: Callable[[RedisError], LockBackendError]

    def run(self) -> Any:
        try:
            result = self.script(lock_client(self.alias), self.keys, self.args)
        except RedisError as exc:
            raise self.failed(exc) from exc
        return self.done(result)

    async def arun(self) -> Any:
        try:
            result = await self.script.acall(async_lock_client(self.alias), self.keys, self.args)
        except RedisError as exc:
            raise self.failed(exc) from exc
        return self.done(result)


@dataclass(eq=False)
class _Acquisition:
    """The state of one acquire() call, shared by its sync and async loops."""

    owner: object
    alias: LockAlias
    keys: LockKeys
    fresh: bool  # a new token: not a re-entry into a hold this owner has already
    token: str
    lease: float
    lease_ms: int
    renew: bool
    record: str
    nonce: str
    max_wait: float
    started: float
    deadline: float
    mode: int = _TRY
    sent_at: float = 0.0  # when the latest ACQUIRE went out: a lease it granted ends after
    reply_budget: float | None = None  # how long it may go unanswered (_attempt_args)
    queued: bool = False
    stale_wake: bool = False  # a block timed out: a late wake-up may be waiting in Redis
    wait_hint: float = 0.0
    failure: _Attempt | None = None  # what the holder looked like when we could not get in
    want_result: bool = False
    result: bytes | None = None

    def give_back(self) -> tuple[Any, ...]:
        """Sent after an ACQUIRE whose reply we gave up on (too slow, cancelled), on the same
        connection, so that Redis runs it after the ACQUIRE: the lease that one may grant goes
        back instead of being held for a lease by nobody. (For a new acquisition only: a
        re-entry's level cannot be told from the holder's own.)"""
        return RELEASE.command([self.keys.lease], [self.token, 0])


class Lock:
    """A distributed lock named ``name``.

    ``timeout``: the lease in seconds. Not given: ``DJANGO_REDIS_LOCK_TIMEOUT``, renewed in the
    background while held (``DJANGO_REDIS_LOCK_AUTO_RENEW``). Given: not renewed unless
    ``auto_renew=True``. ``wait``: the longest wait in seconds for ``acquire()`` and ``with``
    (default ``DJANGO_REDIS_LOCK_WAIT``; ``0`` never blocks; ``float("inf")`` waits for ever).
    ``reentrant``: the same thread or task may acquire again (a hold count, kept in Redis).
    ``fencing``: each acquisition gets a strictly increasing ``fencing_token``. ``label``: a
    description for people, shown in the admin. ``using``: the cache alias, or a quorum: the
    name of one in ``DJANGO_REDIS_LOCK_QUORUMS``, or a list of cache aliases on independent
    servers (held while a majority holds it, see ``quorum.py``).
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        wait: float | None = None,
        auto_renew: bool | None = None,
        reentrant: bool = False,
        fencing: bool = False,
        label: str | None = None,
        using: str | Sequence[str] | None = None,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"A lock name must be a str, not {type(name).__name__}.")
        if not name:
            raise ValueError("A lock name must not be empty.")
        if timeout is not None:
            timeout = durations.seconds(timeout, "timeout")
        if wait is not None:
            wait = durations.seconds(wait, "wait", wait=True, allow_inf=True)
        for flag, value in (("reentrant", reentrant), ("fencing", fencing)):
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be True or False, not {value!r}.")
        if auto_renew is not None and not isinstance(auto_renew, bool):
            raise TypeError(f"auto_renew must be True, False or None, not {auto_renew!r}.")
        if label is not None and not isinstance(label, str):
            raise TypeError(f"label must be a str, not {type(label).__name__}.")
        if isinstance(using, list | tuple):
            using = checked_quorum(using)
        elif using is not None and (not isinstance(using, str) or not using):
            raise TypeError(
                "using must be a cache alias or quorum name (a non-empty str), or a list of "
                f"cache aliases, not {using!r}."
            )
        self._name = name
        self._timeout = timeout
        self._wait = wait
        self._auto_renew = auto_renew
        self._reentrant = reentrant
        self._fencing = fencing
        self._label = label
        self._using = using
        self._resolved: _Resolved | None = None
        self._holds: weakref.WeakKeyDictionary[object, Hold] = weakref.WeakKeyDictionary()
        self._state = threading.Lock()
        self._records: weakref.WeakKeyDictionary[object, tuple[tuple[Any, ...], str]] = (
            weakref.WeakKeyDictionary()
        )
        self._flags = ("f" if fencing else "") + ("r" if reentrant else "")
        # Set for good once a release through this object did not complete: from then on an
        # acquisition looks for one to finish first (_settle), which costs nothing until then.
        self._release_failed = False

    def __repr__(self) -> str:
        return f"<Lock {self._name!r}{' held' if self._hold() else ''}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle, copy.copy and copy.deepcopy give a new, unheld Lock with the same name and
        # options: a hold belongs to the thread or task (and process) that took it, and a
        # copy that shared it could release it from under its owner.
        options: dict[str, Any] = {
            "timeout": self._timeout, "wait": self._wait, "auto_renew": self._auto_renew,
            "reentrant": self._reentrant, "fencing": self._fencing, "label": self._label,
            "using": self._using,
        }  # fmt: skip
        return (functools.partial(Lock, self._name, **options), ())

    # -- properties ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def label(self) -> str | None:
        return self._label

    @property
    def token(self) -> str | None:
        """The current thread's / task's owner token, or None when it does not hold the lock."""
        hold = self._hold()
        return hold.token if hold else None

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current holder's acquisition (``fencing=True`` only)."""
        hold = self._hold()
        return hold.fence if hold else None

    @property
    def lost(self) -> bool:
        """True when the current holder's lease was found gone (by renewal or a check)."""
        hold = self._hold()
        return bool(hold and hold.lost_reason)

    # -- plumbing ------------------------------------------------------------------------------

    def _hold(self) -> Hold | None:
        return self._hold_of(current_owner())

    def _hold_of(self, owner: object) -> Hold | None:
        # In a forked child, the parent's holds are still in memory, but not the child's:
        # the parent is still inside its critical section, so the child must not release
        # or renew its lease, nor re-enter it.
        hold = self._holds.get(owner)
        return hold if hold is None or hold.pid == holds.pid else None

    def _inherited(self, owner: object) -> bool:
        """Whether ``owner``'s hold is one a forked child inherited from its parent."""
        hold = self._holds.get(owner)
        return hold is not None and hold.pid != holds.pid

    def _resolve(self) -> _Resolved:
        # Settings are read once, when the Lock is first used (then they are fixed for it).
        if self._resolved is None:
            alias = self._using or lock_settings.CACHE_ALIAS
            if self._timeout is None:
                lease = lock_settings.TIMEOUT
                renew = lock_settings.AUTO_RENEW if self._auto_renew is None else self._auto_renew
            else:
                lease, renew = self._timeout, bool(self._auto_renew)
            wait = self._wait if self._wait is not None else lock_settings.WAIT
            self._resolved = _Resolved(alias, lock_keys(self._name, alias), lease, renew, wait)
        return self._resolved

    def _alias_and_keys(self) -> tuple[LockAlias, LockKeys]:
        resolved = self._resolve()
        return resolved.alias, resolved.keys

    def _lease(self) -> tuple[float, bool]:
        resolved = self._resolve()
        return resolved.lease, resolved.renew

    def _max_wait(self, wait: float | None) -> float:
        if wait is not None:
            return durations.seconds(wait, "wait", wait=True, allow_inf=True)
        return self._resolve().wait

    def _owner_record(self, owner: object, lease: float) -> str:
        # Built once per process, owner and lease: it is the same for every acquisition a
        # long-lived Lock object makes from one thread (a thread may be renamed: checked too).
        described = owner_description(owner)
        key = (os.getpid(), tuple(described.values()), lease)
        cached = self._records.get(owner)
        if cached is not None and cached[0] == key:
            return cached[1]
        record = json.dumps(
            {"name": self._name, "label": self._label, "host": _HOST, "pid": key[0],
             **described, "lease": lease},
            separators=(",", ":"),
        )  # fmt: skip
        self._records[owner] = (key, record)
        return record

    def _backend_error(self, action: str, exc: RedisError) -> LockBackendError:
        return LockBackendError(
            f"Could not {action} lock {self._name!r}: {type(exc).__name__}: {exc}", name=self._name
        )

    def _begin(self, wait: float | None, *, want_result: bool = False) -> _Acquisition:
        """Everything an acquisition needs before its first round trip. With ``want_result``
        an acquisition gives up as soon as the guarded work's result is there (``ctx.result``,
        see ``_release_call``): the duplicate-submission guard is built on it."""
        owner = current_owner()
        max_wait = self._max_wait(wait)
        hold = self._hold_of(owner)
        if hold is not None and not self._reentrant:
            raise LockError(
                f"Lock {self._name!r} is already held by this thread/task; "
                "use reentrant=True to acquire it again.",
                name=self._name,
            )
        alias, keys = self._alias_and_keys()
        lease, renew = self._lease()
        token = None
        if self._reentrant:
            token = hold.token if hold else reentrant_tokens.get(owner, keys.lease)
        started = time.monotonic()
        fresh = token is None
        token = token or secrets.token_hex(16)
        return _Acquisition(
            owner=owner,
            alias=alias,
            keys=keys,
            fresh=fresh,
            token=token,
            lease=lease,
            lease_ms=durations.milliseconds(lease),
            renew=renew,
            record=self._owner_record(owner, lease),
            nonce=secrets.token_hex(8) if self._reentrant else "",
            max_wait=max_wait,
            started=started,
            deadline=started + max_wait,
            want_result=want_result,
        )

    def _attempt_args(self, ctx: _Acquisition, mode: int | None = None) -> list[Any]:
        """Arguments of the next ACQUIRE call; decides its mode from the time left."""
        ctx.sent_at = time.monotonic()
        remaining = ctx.deadline - ctx.sent_at
        if mode is None:
            mode = _QUEUE if remaining > 0 else (_LEAVE_OR_TAKE if ctx.queued else _TRY)
        ctx.mode = mode
        flags = self._flags
        # The holder's owner record is only worth its bytes to report a contention (when
        # someone listens) or a failure.
        if mode != _QUEUE or (not ctx.queued and self._contention_observed()):
            flags += "o"
        # A wake-up list is only left behind when a block ended without its wake-up.
        if ctx.stale_wake:
            flags += "w"
        if ctx.want_result:
            flags += "d"
        liveness = min(max(remaining, 0), _BLOCK_CAP) + _LIVENESS_SLACK
        # How long this request may go unanswered before the acquisition gives up: the wait
        # left, but at least _REPLY_FLOOR (None: for ever, and the socket timeout decides). So
        # acquire(wait=1) against a stalled Redis raises after about a second.
        ctx.reply_budget = None if remaining == math.inf else max(remaining, _REPLY_FLOOR)
        return [ctx.token, ctx.lease_ms, ctx.record, mode, flags, int(liveness * 1000), ctx.nonce]

    @staticmethod
    def _replicas(client: Any) -> tuple[int, int]:
        """(replicas that must confirm an acquisition, ms to wait for them)."""
        replicas = lock_settings.MIN_REPLICAS
        if replicas and isinstance(client, QuorumClient | AsyncQuorumClient):
            raise ImproperlyConfigured(
                "DJANGO_REDIS_LOCK_MIN_REPLICAS does not apply in quorum mode: its servers are "
                "independent, with no replicas to wait for. Set it to 0 for quorum locks."
            )
        if replicas and isinstance(client, AsyncRedisCluster):
            raise ImproperlyConfigured(
                "DJANGO_REDIS_LOCK_MIN_REPLICAS is not supported by the async API on a Redis "
                "Cluster yet: use the sync API (or sync_to_async) for these locks."
            )
        return replicas, max(1, int(lock_settings.REPLICA_TIMEOUT * 1000))

    def _unconfirmed(self, acknowledged: int, replicas: int) -> LockBackendError:
        return LockBackendError(
            f"Lock {self._name!r} was taken on the primary but only {acknowledged} of the "
            f"{replicas} replicas required (DJANGO_REDIS_LOCK_MIN_REPLICAS) confirmed it within "
            f"{lock_settings.REPLICA_TIMEOUT}s, so it was released again: a failover now could "
            "have handed it to a second holder.",
            name=self._name,
        )

    @staticmethod
    def _contention_observed() -> bool:
        # `receivers`, not has_listeners(): this runs on every first attempt, and only a cheap
        # "maybe" is needed (a stale weak receiver costs one HGET).
        return bool(signals.lock_contended.receivers) or logger.isEnabledFor(logging.INFO)

    def _step(self, ctx: _Acquisition, result: list[Any]) -> bool | None:
        """Digest one ACQUIRE answer: True (held), False (gave up) or None (wait on)."""
        if result[0] == 1:
            ctx.queued = False
            fence = int(result[1])
            self._acquired(ctx, fence)
            return True
        if result[0] == 2:  # the guarded work is done already: here is its result
            ctx.queued = False
            ctx.result = result[1]
            return False
        owner = None
        if result[2]:
            with contextlib.suppress(ValueError):
                owner = json.loads(result[2])
            if isinstance(owner, dict) and len(result) > 3 and result[3]:
                owner["acquired_at"] = int(result[3]) / 1000  # the server's clock, epoch s
        attempt = _Attempt(wait_hint=max(0, int(result[1])) / 1000, owner=owner)
        if ctx.mode != _QUEUE:
            ctx.queued = False
            # Free but promised to a waiter, the lock has no owner record: the first one seen.
            ctx.failure = attempt if owner or ctx.failure is None else ctx.failure
            if ctx.max_wait > 0:
                logger.warning("Gave up on lock %r after waiting %ss", self._name, ctx.max_wait)
            return False
        if not ctx.queued:
            ctx.queued = True
            ctx.failure = attempt
            self._contended(attempt, ctx.max_wait)
        ctx.wait_hint = attempt.wait_hint
        return None

    @staticmethod
    def _block(ctx: _Acquisition) -> tuple[float, bool]:
        """How long to block for a wake-up, and whether that time must be kept exactly (it
        ends the wait, or the holder's lease) rather than only roughly (a periodic re-check)."""
        remaining = ctx.deadline - time.monotonic()
        if remaining <= 0:
            return 0.0, False
        hint = ctx.wait_hint if ctx.wait_hint > 0 else _BLOCK_CAP
        block = min(remaining, hint, _BLOCK_CAP)
        return max(_MIN_BLOCK, block), block < _BLOCK_CAP

    def _acquired(self, ctx: _Acquisition, fence: int) -> None:
        owner, alias, keys, token = ctx.owner, ctx.alias, ctx.keys, ctx.token
        lease, renew, started = ctx.lease, ctx.renew, ctx.started
        now = time.monotonic()
        with self._state:
            hold = self._holds.get(owner)
            # The lease a grant gives runs from when the request went out, at the latest.
            ends_at = ctx.sent_at + lease
            if hold is not None and hold.token == token:
                hold.count += 1
                hold.lease_ends_at = max(hold.lease_ends_at, ends_at)
            else:
                fenced = fence if self._fencing else None
                hold = Hold(token, fenced, now, lease, ends_at, holds.pid)
                if renew:
                    # Weakly: a lease nobody can release any more is not renewed for ever.
                    watch = HoldWatch(hold, owner, self._report_lost)
                    hold.renewal = RenewedLease(
                        client=lock_client(alias),
                        key=keys.lease,
                        token=token,
                        lease=lease,
                        on_lost=watch.lost,
                        name=self._name,
                        abandoned=watch.abandoned,
                    )
                    hold.renewal.confirmed(ctx.sent_at)
                    renewer.add(hold.renewal)
                self._holds[owner] = hold
        if self._reentrant:
            reentrant_tokens.set(owner, keys.lease, token)
        waited = now - started
        logger.debug("Acquired lock %r after %.3fs", self._name, waited)
        signals.lock_acquired.send(
            sender=Lock, lock=self, name=self._name, label=self._label, waited=waited,
            fencing_token=hold.fence,
        )  # fmt: skip

    def _contended(self, attempt: _Attempt, wait: float) -> None:
        holder = attempt.owner or {}
        logger.info(
            "Waiting up to %ss for lock %r held by %s/%s",
            wait, self._name, holder.get("host", "?"), holder.get("pid", "?"),
        )  # fmt: skip
        signals.lock_contended.send(
            sender=Lock, lock=self, name=self._name, label=self._label, owner=attempt.owner
        )

    def _not_acquired(self, ctx: _Acquisition) -> LockNotAcquired:
        attempt = ctx.failure
        return LockNotAcquired(
            self._name,
            ttl=attempt.wait_hint if attempt else None,
            owner=attempt.owner if attempt else None,
            waited=ctx.max_wait,
        )

    def _released(
        self, owner: object, keys: LockKeys, hold: Hold, remaining: int, *, earlier_ran: bool
    ) -> None:
        releasing_since, hold.releasing_since = hold.releasing_since, None
        hold.release_may_have_run = False
        if (
            remaining < 0
            and earlier_ran
            and hold.count <= 1
            and hold.lost_reason is None
            and releasing_since is not None
            and releasing_since < hold.ends_at() - durations.clock_allowance(hold.lease)
        ):
            # An earlier try was sent while the lease still ran, and its reply was lost: it
            # went through, or the lease ended after the work under it had, so nobody
            # overlapped us. (Unless someone deleted the lease meanwhile and that try never
            # reached Redis: a loss we cannot tell from a lost reply without a trace of every
            # release, see docs/locks.md.)
            remaining = 0
            logger.debug("Lock %r: an earlier try of this release got through", self._name)
        if remaining < 0:
            self._forget(owner, keys, hold)
            self._report_lost(hold, "its lease had ended before it was released")
            raise LockNotOwned(
                f"Lock {self._name!r} was no longer ours to release: its lease had ended "
                "(and someone else may hold it now). Nothing was deleted.",
                name=self._name,
            )
        with self._state:
            hold.count -= 1
            last = hold.count <= 0
        if last:
            # Another Lock object of this owner may still hold a level of a re-entrant lock:
            # the owner's token is forgotten only when Redis says the last level is gone.
            self._forget(owner, keys, hold, owner_done=remaining == 0)
            held = time.monotonic() - hold.acquired_at
            logger.debug("Released lock %r after %.3fs", self._name, held)
            signals.lock_released.send(
                sender=Lock, lock=self, name=self._name, label=self._label, held=held
            )
        elif remaining == 0 and self._reentrant:
            reentrant_tokens.forget(owner, keys.lease, hold.token)

    def _forget(
        self, owner: object, keys: LockKeys, hold: Hold, *, owner_done: bool = True
    ) -> None:
        if hold.renewal is not None:
            renewer.remove(hold.renewal)
        with self._state:
            if self._holds.get(owner) is hold:
                del self._holds[owner]
        if self._reentrant and owner_done:
            reentrant_tokens.forget(owner, keys.lease, hold.token)

    def _report_lost(self, hold: Hold, reason: str) -> None:
        """Make a loss loud, once: ERROR log, ``lock_lost`` signal, ``lock.lost``."""
        with self._state:
            if hold.lost_reason is not None:
                return
            hold.lost_reason = reason
        if hold.renewal is not None:
            renewer.remove(hold.renewal)
        held = time.monotonic() - hold.acquired_at
        logger.error(
            "Lost lock %r (label %r) after holding it %.3fs: %s. Work done under it may have "
            "overlapped another holder's.",
            self._name, self._label, held, reason,
        )  # fmt: skip
        signals.lock_lost.send(
            sender=Lock, lock=self, name=self._name, label=self._label, held=held, reason=reason
        )

    def _held_or_raise(self, owner: object) -> Hold:
        hold = self._hold_of(owner)
        if hold is None:
            forked = " (its parent process holds it, not this forked child)"
            raise LockNotOwned(
                f"Lock {self._name!r} is not held by this thread/task through this Lock object"
                f"{forked if self._inherited(owner) else ''}.",
                name=self._name,
            )
        return hold

    def _lost_error(self, hold: Hold) -> LockLost:
        return LockLost(
            f"Lock {self._name!r} was lost while held: {hold.lost_reason}.", name=self._name
        )

    # -- synchronous API -----------------------------------------------------------------------

    def acquire(self, wait: float | None = None) -> bool:
        """Take the lock, waiting up to ``wait`` seconds; True when taken, False when not."""
        if self._release_failed:
            self._settle()
        return self._acquire(self._begin(wait))

    def _unsettled(self) -> _Call | None:
        """A release of this owner's hold that failed and was never retried. A new
        acquisition finishes it first: the work it ended is over, and re-entering a hold whose
        lease may be gone, and is no longer renewed, would be holding nothing."""
        hold = self._hold()
        return None if hold is None or hold.releasing_since is None else self._release_call()

    def _settle(self) -> None:
        call = self._unsettled()
        if call is not None:
            with contextlib.suppress(LockNotOwned):  # a loss, reported as such
                call.run()

    def _acquire(self, ctx: _Acquisition) -> bool:
        client = lock_client(ctx.alias)
        try:
            while True:
                replicas, timeout_ms = self._replicas(client)
                if replicas:
                    result, acknowledged = ACQUIRE.call_acknowledged(
                        client, [ctx.keys.lease], self._attempt_args(ctx), replicas, timeout_ms,
                        wanted=_granted,
                    )  # fmt: skip
                    if _granted(result) and acknowledged < replicas:
                        RELEASE(client, [ctx.keys.lease], [ctx.token, ctx.nonce or 0])
                        # Perhaps a stale primary after a failover: ask again where it is.
                        drop_stale_connections(client, ctx.keys.lease)
                        raise self._unconfirmed(acknowledged, replicas)
                else:
                    args = self._attempt_args(ctx)
                    result = ACQUIRE(
                        client, [ctx.keys.lease], args,
                        reply_timeout=ctx.reply_budget,
                        if_silent=ctx.give_back if ctx.fresh else None,
                    )  # fmt: skip
                outcome = self._step(ctx, result)
                if outcome is not None:
                    return outcome
                block, exact = self._block(ctx)
                if block:
                    woken = wait_for_wake(client, ctx.keys.wake(ctx.token), block, exact=exact)
                    ctx.stale_wake = ctx.stale_wake or not woken
        except RedisError as exc:
            if isinstance(exc, RedisTimeoutError):
                ctx.queued = False  # nothing to tell a Redis that does not answer: see below
            raise self._backend_error("acquire", exc) from exc
        finally:
            if ctx.queued:  # interrupted while queued: step out of the line, pass the turn on
                # If Redis cannot hear it, our liveness deadline passes and the queue skips us.
                with contextlib.suppress(RedisError):
                    ACQUIRE(client, [ctx.keys.lease], self._attempt_args(ctx, _LEAVE))

    def release(self) -> None:
        """Release our acquisition (one level of it, for re-entrant locks).

        Raises ``LockNotOwned`` when this thread/task does not hold it, or when its lease had
        already ended (then nothing is deleted: the lock may be someone else's by now). On a
        connection error raises ``LockBackendError`` and keeps the token, so that ``release()``
        can be retried; renewal stops, so an unreleased lease ends by itself.
        """
        try:
            self._release_call().run()
        except BaseException:
            self._release_failed = True
            raise

    def extend(self, seconds: float | None = None) -> None:
        """Make our lease end ``seconds`` from now (default: the lock's lease length)."""
        self._extend_call(seconds).run()

    def _release_call(self, result: bytes | None = None, result_ttl: float = 0) -> _Call:
        """The release, optionally leaving ``result`` for ``result_ttl`` seconds for later
        acquisitions made with ``want_result`` (written in the same script, before the lock
        is free)."""
        owner = current_owner()
        hold = self._held_or_raise(owner)
        alias, keys = self._alias_and_keys()
        # A try that failed (or was cancelled) may have got through before its reply was
        # lost: a retry must not take a second level, nor call the lease lost (_released).
        if hold.releasing_since is None:
            hold.releasing_since = time.monotonic()
            hold.release_nonce = secrets.token_hex(8) if self._reentrant else "0"
        earlier_ran = hold.release_may_have_run
        hold.release_may_have_run = True  # until this try says otherwise (a cancel cannot)
        if hold.count <= 1 and hold.renewal is not None:
            renewer.remove(hold.renewal)  # the work is done: renewing now could only mislead

        def failed(exc: RedisError) -> LockBackendError:
            hold.release_may_have_run = earlier_ran or request_sent(exc)
            if hold.renewal is not None:
                renewer.remove(hold.renewal)
            return self._backend_error("release", exc)

        keep = [result, durations.milliseconds(result_ttl)] if result is not None else []
        return _Call(
            RELEASE,
            alias,
            [keys.lease],
            [hold.token, hold.release_nonce, *keep],
            done=lambda remaining: self._released(
                owner, keys, hold, int(remaining), earlier_ran=earlier_ran
            ),
            failed=failed,
        )

    def _extend_call(self, seconds: float | None) -> _Call:
        owner = current_owner()
        hold = self._held_or_raise(owner)
        if seconds is None:
            lease = self._lease()[0]
        else:
            lease = durations.seconds(seconds, "extend(seconds)")
        alias, keys = self._alias_and_keys()
        started = time.monotonic()

        def done(ok: Any) -> None:
            if not ok:
                self._forget(owner, keys, hold)
                self._report_lost(hold, "its lease had ended before it was extended")
                raise LockNotOwned(
                    f"Lock {self._name!r} was no longer ours to extend.", name=self._name
                )
            hold.lease, hold.lease_ends_at = lease, started + lease
            if hold.renewal is not None:
                hold.renewal.confirmed(started, lease)

        return _Call(
            EXTEND,
            alias,
            [keys.lease],
            [hold.token, durations.milliseconds(lease)],
            done=done,
            failed=lambda exc: self._backend_error("extend", exc),
        )

    def locked(self) -> bool:
        """Whether anyone holds the lock right now."""
        alias, keys = self._alias_and_keys()
        try:
            return bool(execute(lock_client(alias), "EXISTS", keys.lease))
        except RedisError as exc:
            raise self._backend_error("read", exc) from exc

    def owned(self) -> bool:
        """Whether this thread/task holds the lock right now (asks Redis)."""
        hold = self._hold()
        if hold is None:
            return False
        alias, keys = self._alias_and_keys()
        try:
            holder = execute(lock_client(alias), "HGET", keys.lease, "token")
        except RedisError as exc:
            raise self._backend_error("read", exc) from exc
        if isinstance(holder, bytes):  # unless the client was built with decode_responses
            holder = holder.decode()
        return bool(holder == hold.token)

    def ttl(self) -> float | None:
        """Seconds left on the current lease, whoever holds it; None when nobody does, and
        ``math.inf`` for a key without an expiry (never ours: someone wrote it by hand)."""
        alias, keys = self._alias_and_keys()
        try:
            milliseconds = int(execute(lock_client(alias), "PTTL", keys.lease))
        except RedisError as exc:
            raise self._backend_error("read", exc) from exc
        if milliseconds == -1:
            logger.warning("Lock %r: its key %s never expires", self._name, keys.lease)
            return math.inf
        return milliseconds / 1000 if milliseconds >= 0 else None

    def ensure_held(self) -> None:
        """Raise ``LockLost`` unless Redis confirms we still hold the lock. Call it before a
        write that must not happen without the lock."""
        owner = current_owner()
        hold = self._held_or_raise(owner)
        if hold.lost_reason is None and not self.owned():
            self._report_lost(hold, "its lease was gone when checked")
        if hold.lost_reason is not None:
            raise self._lost_error(hold)

    def __enter__(self) -> Lock:
        if self._release_failed:
            self._settle()
        ctx = self._begin(None)
        if not self._acquire(ctx):
            raise self._not_acquired(ctx)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._inherited(current_owner()):
            return  # a forked child leaving the with block: the lock stays its parent's
        hold = self._hold()
        try:
            self.release()
        except (LockNotOwned, LockBackendError) as error:
            self._exit_error(hold, exc, error)

    def _exit_error(self, hold: Hold | None, exc: BaseException | None, error: LockError) -> None:
        """A release at the end of a ``with`` block failed: say so without hiding ``exc``."""
        if isinstance(error, LockBackendError) and hold is not None and hold.count > 1:
            # An inner level of a re-entrant lock: nobody retries it (the outer with block's
            # release is the next level's, not a retry). Given up here; the lease ends with
            # the outer level's release, or by itself.
            with self._state:
                hold.count -= 1
                hold.releasing_since, hold.release_may_have_run = None, False
        if exc is not None:
            logger.exception("Could not release lock %r after an error", self._name)
        elif isinstance(error, LockNotOwned) and hold is not None:
            raise self._lost_error(hold) from error
        else:
            raise error

    # -- asynchronous API ----------------------------------------------------------------------

    async def aacquire(self, wait: float | None = None) -> bool:
        """``acquire()`` for asyncio: waits without blocking the event loop."""
        if self._release_failed:
            await self._asettle()
        return await self._aacquire(self._begin(wait))

    async def _asettle(self) -> None:
        call = self._unsettled()
        if call is not None:
            with contextlib.suppress(LockNotOwned):
                await call.arun()

    async def _aacquire(self, ctx: _Acquisition) -> bool:
        client = async_lock_client(ctx.alias)
        try:
            while True:
                replicas, timeout_ms = self._replicas(client)
                if replicas:
                    result, acknowledged = await ACQUIRE.acall_acknowledged(
                        client, [ctx.keys.lease], self._attempt_args(ctx), replicas, timeout_ms,
                        wanted=_granted,
                    )  # fmt: skip
                    if _granted(result) and acknowledged < replicas:
                        await RELEASE.acall(client, [ctx.keys.lease], [ctx.token, ctx.nonce or 0])
                        await adrop_stale_connections(client)
                        raise self._unconfirmed(acknowledged, replicas)
                else:
                    args = self._attempt_args(ctx)
                    result = await ACQUIRE.acall(
                        client, [ctx.keys.lease], args,
                        reply_timeout=ctx.reply_budget,
                        if_silent=ctx.give_back if ctx.fresh else None,
                    )  # fmt: skip
                outcome = self._step(ctx, result)
                if outcome is not None:
                    return outcome
                block, exact = self._block(ctx)
                if block:
                    woken = await await_wake(client, ctx.keys.wake(ctx.token), block, exact=exact)
                    ctx.stale_wake = ctx.stale_wake or not woken
        except RedisError as exc:
            if isinstance(exc, RedisTimeoutError):
                ctx.queued = False
            raise self._backend_error("acquire", exc) from exc
        finally:
            if ctx.queued:
                leave = ACQUIRE.acall(client, [ctx.keys.lease], self._attempt_args(ctx, _LEAVE))
                with contextlib.suppress(RedisError, asyncio.CancelledError):
                    await asyncio.shield(leave)

    async def arelease(self) -> None:
        """``release()`` for asyncio."""
        try:
            await self._release_call().arun()
        except BaseException:  # a cancellation too
            self._release_failed = True
            raise

    async def aextend(self, seconds: float | None = None) -> None:
        """``extend()`` for asyncio."""
        await self._extend_call(seconds).arun()

    async def __aenter__(self) -> Lock:
        if self._release_failed:
            await self._asettle()
        ctx = self._begin(None)
        if not await self._aacquire(ctx):
            raise self._not_acquired(ctx)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._inherited(current_owner()):
            return
        hold = self._hold()
        try:
            await self.arelease()
        except (LockNotOwned, LockBackendError) as error:
            self._exit_error(hold, exc, error)
