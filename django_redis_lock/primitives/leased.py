"""What every leased primitive (``Lock``, ``Semaphore``) offers its callers, sync and async:
acquire, claim, release, extend, ``with`` and ``async with``. Each method asks its bookkeeping
(``bookkeeping.py``) what to send, runs that flow of the core (``core/flows.py``) with the
blocking or the asyncio driver, and hands the outcome back to the bookkeeping, so the two APIs,
and the primitives, cannot drift apart."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

from redis.exceptions import RedisError

from ..backends import async_backend_of, backend_of, drivers
from ..backends.clients import LockAlias
from ..backends.drivers import arun, run
from ..backends.inflight import carry
from ..core import durations, flows
from ..core.durations import clock_allowance
from ..exceptions import LockBackendError, LockNotOwned
from ..validators import checked_quorum
from . import eviction, uncontended
from .background import process_records
from .bookkeeping import Bookkeeping, Layout
from .claims import Claim, Pending
from .owners import current_owner

__all__ = ["Leased"]

_Self = TypeVar("_Self", bound="Leased")


class Leased:
    """The API a leased primitive shares, and the options every one takes (``_set_up``, called
    by its ``__init__``); a subclass says how to tell whether the current thread/task still
    holds it (``owned()``)."""

    _book: Bookkeeping

    @property
    def name(self) -> str:
        return self._book.name

    @property
    def label(self) -> str | None:
        return self._book.label

    @property
    def group(self) -> str:
        """What the metrics count this under: ``group=``, else the name's leading parts."""
        return self._book.group

    @property
    def token(self) -> str | None:
        """The current thread's / task's owner token, or None when it does not hold the lock."""
        hold = self._book.hold()
        return hold.token if hold else None

    @property
    def lost(self) -> bool:
        """True when the current holder's lease was found gone (by renewal or a check)."""
        hold = self._book.hold()
        return bool(hold and hold.lost_reason)

    @property
    def held_until(self) -> float | None:
        """Until when (``time.monotonic()`` seconds) the current thread/task may act as the
        holder, as far as it knows without asking Redis: its lease's end (each renewal moves it
        on) less the allowance for Redis's clock running fast. None when it holds nothing, or
        was told that its lease is lost. Check it before a step that must not outlive the
        lease; :meth:`ensure_held` asks Redis."""
        hold = self._book.hold()
        if hold is None or hold.lost_reason is not None:
            return None
        return hold.ends_at() - clock_allowance(hold.lease)

    def owned(self) -> bool:
        """Whether this thread/task holds it right now (asks Redis)."""
        raise NotImplementedError

    # -- the seam of a primitive made of several (lock_many) ----------------------------------

    @property
    def release_unsettled(self) -> bool:
        """Whether a release through this object failed (a ``LockBackendError``) and may be
        unfinished: :meth:`claim` finishes it first; :meth:`plan_acquisition` does not, so a
        caller of it takes such a primitive with :meth:`claim` instead."""
        return self._book.release_failed

    def plan_acquisition(self, wait: float | None = None) -> Pending | Claim:
        """An acquisition prepared, not yet sent: its plan (``pending.plan``, for a flow of
        ``core/``), or a :class:`Claim` when it needs no round trip (a re-entry, counted
        already). For a primitive that takes this one with others in one script
        (``group.LockGroup``); everyone else calls :meth:`claim`."""
        return self._book.prepare(wait, False)

    def settle_acquisition(self, pending: Pending, outcome: Any) -> Claim:
        """What a flow's outcome for ``pending`` (from :meth:`plan_acquisition`) means: held
        from now on (renewed, reported), or why not."""
        return self._book.settled(pending, outcome)

    def _set_up(
        self, kind: str, name: str, *, timeout: float | None, wait: float | None,
        auto_renew: bool | None, label: str | None, using: str | Sequence[str] | None,
        group: str | None, layout: Layout, **own: Any,
    ) -> None:  # fmt: skip
        """Check the options every primitive takes (``kind``: "lock"...), and keep them with
        the primitive's ``own`` (checked by it) in its bookkeeping."""
        if not isinstance(name, str):
            raise TypeError(f"A {kind} name must be a str, not {type(name).__name__}.")
        if not name:
            raise ValueError(f"A {kind} name must not be empty.")
        if timeout is not None:
            timeout = durations.seconds(timeout, "timeout")
        if wait is not None:
            wait = durations.seconds(wait, "wait", wait=True, allow_inf=True)
        if auto_renew is not None and not isinstance(auto_renew, bool):
            raise TypeError(f"auto_renew must be True, False or None, not {auto_renew!r}.")
        if label is not None and not isinstance(label, str):
            raise TypeError(f"label must be a str, not {type(label).__name__}.")
        if group is not None and (not isinstance(group, str) or not group):
            raise TypeError(f"group must be a non-empty str, not {group!r}.")
        if isinstance(using, list | tuple):
            using = checked_quorum(using)
        elif using is not None and (not isinstance(using, str) or not using):
            raise TypeError(
                "using must be a cache alias or quorum name (a non-empty str), or a list of "
                f"cache aliases, not {using!r}."
            )
        self._book = Bookkeeping(
            self, name, timeout=timeout, wait=wait, auto_renew=auto_renew, label=label,
            using=using, group=group, layout=layout, **own,
        )  # fmt: skip

    # -- synchronous API -----------------------------------------------------------------------

    def acquire(self, wait: float | None = None) -> bool:
        """Take the lock, waiting up to ``wait`` seconds; True when taken, False when not."""
        return self.claim(wait).acquired

    def claim(self, wait: float | None = None, *, want_result: bool = False) -> Claim:
        """:meth:`acquire`, telling why not. With ``want_result``, an acquisition gives up as
        soon as the guarded work's result is there (left by ``release(result=...)``): the
        duplicate-submission and run-once guards are built on it. For a lock held for a job
        (``job_id``), only a result that is the job's id counts: a run of the same job that
        finished (the task guards leave it)."""
        book = self._book
        self.before_acquiring()
        quick = None if want_result else uncontended.take(book, wait)
        if quick is not None:  # the lock may be free: one bare SET, flat
            try:
                reply = backend_of(quick.alias).send_request(
                    *quick.command, reply_timeout=quick.reply_timeout, if_silent=quick.give_back
                )
            except RedisError as exc:
                raise book.backend_error("acquire", exc, quick.started) from exc
            pending: Pending | Claim = uncontended.settled(book, quick, reply)
        else:
            if book.release_failed:
                self._settle()
            pending = book.prepare(wait, want_result)
        if isinstance(pending, Claim):
            return pending
        try:
            outcome = run(flows.acquire(pending.plan), backend_of(pending.alias))
        except (RedisError, flows.Unconfirmed) as exc:
            raise self._book.backend_error("acquire", exc, pending.plan.started) from exc
        return self._book.settled(pending, outcome)

    def before_acquiring(self) -> None:
        """What this process does on the primitive's Redis before an acquisition, when due:
        writes its record (which the watch for dead holders of the other processes on this
        machine reads), and gives its advice on eviction (before its first lock there, so
        nothing is held meanwhile). Public for ``lock_many``, which takes its members in one
        script without their ``claim()``."""
        resolved = self._book.options()
        if resolved.on_holder is not None and process_records.recorded.due(resolved.alias):
            self._write_record(resolved.alias)
        if eviction.advised.due(resolved.alias):
            eviction.advise(resolved.alias)

    async def abefore_acquiring(self) -> None:
        """:meth:`before_acquiring` for asyncio (the advice on eviction is given in a worker
        thread, not waited for)."""
        resolved = self._book.options()
        if resolved.on_holder is not None and process_records.recorded.due(resolved.alias):
            await self._awrite_record(resolved.alias)
        if eviction.advised.due(resolved.alias):
            eviction.aadvise(resolved.alias)

    @staticmethod
    def _write_record(alias: LockAlias) -> None:
        """This process's record, due before this acquisition: its first on ``alias``, or
        minutes later (a watch for dead holders reads it)."""
        reply: Any
        try:
            reply = backend_of(alias).send_request(*process_records.record_args(alias))
        except RedisError as exc:
            reply = exc
        process_records.recorded.done(alias, reply)

    def release(self, *, result: bytes | None = None, result_ttl: float = 0) -> None:
        """Release our acquisition (one level of it, for re-entrant locks).

        Raises ``LockNotOwned`` when this thread/task does not hold it, or when its lease had
        already ended (then nothing is deleted: the lock may be someone else's by now). On a
        connection error raises ``LockBackendError`` and keeps the token, so that ``release()``
        can be retried; renewal stops, so an unreleased lease ends by itself. ``result``: left
        for ``result_ttl`` seconds for acquisitions made with ``claim(want_result=True)``.
        """
        step = self._book.release_step(result, result_ttl)
        if step.request is None:
            return
        try:
            code, first = drivers.release(step.request, step.keys, backend_of(step.alias))
        except RedisError as exc:
            raise self._book.release_failure(step, exc) from exc
        except BaseException as exc:
            self._book.release_failure(step, exc)
            # Interrupted (a KeyboardInterrupt between two bytecodes): the release is finished
            # before the interrupt goes on, or the lock would stay held by nobody for a lease.
            # Tried again as a retry, which takes a lease already gone for released.
            with contextlib.suppress(Exception):
                self._settle()
            raise
        self._book.released(step, code, first)

    def extend(self, seconds: float | None = None) -> None:
        """Make our lease end ``seconds`` from now (default: the lock's lease length)."""
        step = self._book.extend_step(seconds)
        assert step.flow is not None
        try:
            extended = run(step.flow, backend_of(step.alias))
        except (RedisError, flows.Unconfirmed) as exc:
            raise self._book.backend_error("extend", exc) from exc
        self._book.extended(step, extended)

    def ensure_held(self) -> None:
        """Raise ``LockLost`` unless Redis confirms we still hold the lock. Call it before a
        write that must not happen without the lock."""
        hold = self._book.held_or_raise()
        if hold.lost_reason is None and not self.owned():
            self._book.report_lost(hold, "its lease was gone when checked")
        if hold.lost_reason is not None:
            raise self._book.lost_error(hold)

    def __enter__(self: _Self) -> _Self:
        self.claim().raise_unless_acquired()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._book.inherited(current_owner()):
            return  # a forked child leaving the with block: the lock stays its parent's
        hold = self._book.hold()
        try:
            self.release()
        except (LockNotOwned, LockBackendError) as error:
            self._book.exit_error(hold, exc, error)

    def _settle(self) -> None:
        step = self._book.unsettled()
        if step is not None and step.request is not None:
            try:
                backend = backend_of(step.alias)
                self._book.released(step, *drivers.release(step.request, step.keys, backend))
            except LockNotOwned:
                pass  # a loss, reported as such
            except RedisError as exc:
                raise self._book.release_failure(step, exc) from exc

    # -- asynchronous API ----------------------------------------------------------------------

    async def aacquire(self, wait: float | None = None) -> bool:
        """``acquire()`` for asyncio: waits without blocking the event loop."""
        return (await self.aclaim(wait)).acquired

    async def aclaim(self, wait: float | None = None, *, want_result: bool = False) -> Claim:
        """``claim()`` for asyncio."""
        book = self._book
        await self.abefore_acquiring()
        quick = None if want_result else uncontended.take(book, wait)
        if quick is not None:
            try:
                reply = await async_backend_of(quick.alias).send_request(
                    *quick.command, reply_timeout=quick.reply_timeout, if_silent=quick.give_back
                )
            except RedisError as exc:
                raise book.backend_error("acquire", exc, quick.started) from exc
            pending: Pending | Claim = uncontended.settled(book, quick, reply)
        else:
            if book.release_failed:
                await self._asettle()
            pending = book.prepare(wait, want_result)
        if isinstance(pending, Claim):
            return pending
        backend = async_backend_of(pending.alias)

        async def give_back(outcome: Any) -> None:
            # Granted as the caller was cancelled: held, then released, before it goes on.
            if self._book.settled(pending, outcome).acquired:
                with contextlib.suppress(LockNotOwned, LockBackendError):
                    await self.arelease()

        try:
            outcome = await arun(flows.acquire(pending.plan), backend, give_back=give_back)
        except (RedisError, flows.Unconfirmed) as exc:
            raise self._book.backend_error("acquire", exc, pending.plan.started) from exc
        return self._book.settled(pending, outcome)

    @staticmethod
    async def _awrite_record(alias: LockAlias) -> None:
        reply: Any
        try:
            reply = await async_backend_of(alias).send_request(*process_records.record_args(alias))
        except RedisError as exc:
            reply = exc
        process_records.recorded.done(alias, reply)

    async def arelease(self, *, result: bytes | None = None, result_ttl: float = 0) -> None:
        """``release()`` for asyncio."""
        step = self._book.release_step(result, result_ttl)
        if step.request is None:
            return
        # Carried to its end and accounted for, then a cancellation meanwhile goes on.
        done = await carry(drivers.arelease(step.request, step.keys, async_backend_of(step.alias)))
        with _then_raising(done.cancelled):
            if isinstance(done.error, RedisError):
                raise self._book.release_failure(step, done.error) from done.error
            if done.error is not None:
                self._book.release_failure(step, done.error)
                raise done.error
            self._book.released(step, *done.reply)

    async def aextend(self, seconds: float | None = None) -> None:
        """``extend()`` for asyncio."""
        step = self._book.extend_step(seconds)
        assert step.flow is not None
        done = await carry(arun(step.flow, async_backend_of(step.alias)))
        with _then_raising(done.cancelled):
            if isinstance(done.error, RedisError | flows.Unconfirmed):
                raise self._book.backend_error("extend", done.error) from done.error
            self._book.extended(step, done.result())

    async def __aenter__(self: _Self) -> _Self:
        (await self.aclaim()).raise_unless_acquired()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._book.inherited(current_owner()):
            return
        hold = self._book.hold()
        try:
            await self.arelease()
        except (LockNotOwned, LockBackendError) as error:
            self._book.exit_error(hold, exc, error)

    async def _asettle(self) -> None:
        step = self._book.unsettled()
        if step is not None and step.request is not None:
            backend = async_backend_of(step.alias)
            done = await carry(drivers.arelease(step.request, step.keys, backend))
            with _then_raising(done.cancelled):
                if isinstance(done.error, RedisError):
                    raise self._book.release_failure(step, done.error) from done.error
                with contextlib.suppress(LockNotOwned):
                    self._book.released(step, *done.result())


@contextlib.contextmanager
def _then_raising(cancelled: BaseException | None) -> Iterator[None]:
    """Account for a carried request's outcome (``inflight.carry``), then raise the caller's
    cancellation that came meanwhile, if one did: ahead of what the accounting raised."""
    try:
        yield
    except BaseException as error:
        if cancelled is None:
            raise
        raise cancelled from error
    if cancelled is not None:
        raise cancelled
