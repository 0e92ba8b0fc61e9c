"""``Lock``: a distributed lock on Redis with a finite lease, an owner token and fair waiting.

    with Lock("reports:nightly", label="nightly report") as held:
        ...                                   # renewed in the background while inside

    lock = Lock("import:42", timeout=30, wait=0)
    if lock.acquire():                        # -> bool, does not block with wait=0
        try: ...
        finally: lock.release()               # only ever deletes our own lease

Nothing touches Redis until the first acquire. A free lock is taken with one ``SET NX PX``; a
waiter queues, blocks on its own wake-up list, and is handed the lease by the release, first
come first served (``core/flows.py`` decides each step, ``backends/`` carries it out; this
module keeps the holds). A ``Lock`` object may be shared between threads and asyncio tasks:
each holds (and may release) only its own acquisition.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from redis.exceptions import RedisError

from . import durations
from .backends import async_backend_for, backend_of
from .backends.drivers import arun, run
from .claims import Claim
from .connection import async_lock_client
from .core import flows
from .core.lease import job_id_checked
from .core.requests import Command
from .exceptions import LockBackendError, LockNotOwned
from .hints import check_names, keyword_names
from .holding import Holding
from .holds import Hold, current_owner
from .quorum import members as checked_quorum

__all__ = ["LOCK_OPTIONS", "Claim", "Lock"]

logger = logging.getLogger("django_redis_lock")


class Lock(Holding):
    """A distributed lock named ``name``.

    ``timeout``: the lease in seconds. Not given: ``DJANGO_REDIS_LOCK_TIMEOUT``, renewed in the
    background while held (``DJANGO_REDIS_LOCK_AUTO_RENEW``). Given: not renewed unless
    ``auto_renew=True``. ``wait``: the longest wait in seconds for ``acquire()`` and ``with``
    (default ``DJANGO_REDIS_LOCK_WAIT``; ``0`` never blocks; ``float("inf")`` waits for ever).
    ``reentrant``: the same thread or task may acquire again (levels counted in the process).
    ``fencing``: each acquisition gets a strictly increasing ``fencing_token``. ``label``: a
    description for people, shown in the admin. ``using``: the cache alias, or a quorum: the
    name of one in ``DJANGO_REDIS_LOCK_QUORUMS``, or a list of cache aliases on independent
    servers (held while a majority holds it, see ``quorum/``). ``job_id``: the id of the job
    the lock is held for (a Celery task's, an RQ job's): each acquisition's owner token starts
    with it, so that another process (a worker's supervisor, after the job died) can release
    exactly that job's hold with ``registry.release_job(name, job_id)``; and an acquisition
    takes over the job's reservation (``jobs.reserve``, made when the job was queued) as if
    the lock were free. ``guard``: what kind of guard holds the lock (the task guards write
    their mode, ``"until_executed"``...), shown in the admin and ``redis_locks``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Lock:
        # Before __init__'s own TypeError: say which of our options another library's is.
        check_names(kwargs, "Lock()", takes=LOCK_OPTIONS)
        return super().__new__(cls)

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
        job_id: str | None = None,
        guard: str | None = None,
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
        for text, given in (("label", label), ("guard", guard)):
            if given is not None and not isinstance(given, str):
                raise TypeError(f"{text} must be a str, not {type(given).__name__}.")
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
        self._job_id = None if job_id is None else job_id_checked(job_id)
        self._guard = guard or None
        self._using = using
        self._resolved = None
        self._holds: weakref.WeakKeyDictionary[object, Hold] = weakref.WeakKeyDictionary()
        self._state = threading.Lock()
        # Set for good once a release through this object did not complete: from then on an
        # acquisition looks for one to finish first (_settle), which costs nothing until then.
        self._release_failed = False
        # When an acquisition through this object last had to wait: for a while after, the
        # next one joins the queue at once instead of first trying a bare SET that would fail.
        self._contended_at = -math.inf

    def __repr__(self) -> str:
        return f"<Lock {self._name!r}{' held' if self._hold() else ''}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle, copy.copy and copy.deepcopy give a new, unheld Lock with the same name and
        # options: a hold belongs to the thread or task (and process) that took it, and a
        # copy that shared it could release it from under its owner.
        options: dict[str, Any] = {
            "timeout": self._timeout, "wait": self._wait, "auto_renew": self._auto_renew,
            "reentrant": self._reentrant, "fencing": self._fencing, "label": self._label,
            "using": self._using, "job_id": self._job_id, "guard": self._guard,
        }  # fmt: skip
        return (functools.partial(Lock, self._name, **options), ())

    # -- properties ----------------------------------------------------------------------------

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
        if self._release_failed:
            self._settle()
        pending = self._prepare(wait, want_result)
        if isinstance(pending, Claim):
            return pending
        try:
            outcome = run(flows.acquire(pending.plan), backend_of(pending.alias))
        except (RedisError, flows.Unconfirmed) as exc:
            raise self._backend_error("acquire", exc) from exc
        return self._settled(pending, outcome)

    def release(self, *, result: bytes | None = None, result_ttl: float = 0) -> None:
        """Release our acquisition (one level of it, for re-entrant locks).

        Raises ``LockNotOwned`` when this thread/task does not hold it, or when its lease had
        already ended (then nothing is deleted: the lock may be someone else's by now). On a
        connection error raises ``LockBackendError`` and keeps the token, so that ``release()``
        can be retried; renewal stops, so an unreleased lease ends by itself. ``result``: left
        for ``result_ttl`` seconds for acquisitions made with ``claim(want_result=True)``.
        """
        step = self._release_step(result, result_ttl)
        if step.flow is None:
            return
        try:
            code = run(step.flow, backend_of(step.alias))
        except RedisError as exc:
            raise self._release_failure(step, exc) from exc
        except BaseException as exc:
            self._release_failure(step, exc)
            raise
        self._released(step, code)

    def extend(self, seconds: float | None = None) -> None:
        """Make our lease end ``seconds`` from now (default: the lock's lease length)."""
        step = self._extend_step(seconds)
        assert step.flow is not None
        try:
            extended = run(step.flow, backend_of(step.alias))
        except (RedisError, flows.Unconfirmed) as exc:
            raise self._backend_error("extend", exc) from exc
        self._extended(step, extended)

    def detach(self) -> str:
        """Stop holding the lock in this thread/task without releasing it, and return the
        lease's token: the lease runs on, no longer renewed, until it ends or another process
        takes it over (a job's next run, after ``jobs.reserve`` made it the job's reservation
        again; ``registry.force_release``). All levels of a re-entrant hold are given up. No
        round trip. Raises ``LockNotOwned`` when this thread/task does not hold it."""
        owner = current_owner()
        hold = self._held_or_raise(owner)
        self._let_go(owner, hold)
        return hold.token

    def locked(self) -> bool:
        """Whether anyone holds the lock right now."""
        return bool(self._read("EXISTS"))

    def owned(self) -> bool:
        """Whether this thread/task holds the lock right now (asks Redis)."""
        hold = self._hold()
        return hold is not None and self._holds_token(self._read("GET"), hold)

    def ttl(self) -> float | None:
        """Seconds left on the current lease, whoever holds it; None when nobody does, and
        ``math.inf`` for a key without an expiry (never ours: someone wrote it by hand)."""
        return self._seconds_left(self._read("PTTL"))

    def ensure_held(self) -> None:
        """Raise ``LockLost`` unless Redis confirms we still hold the lock. Call it before a
        write that must not happen without the lock."""
        hold = self._held_or_raise()
        if hold.lost_reason is None and not self.owned():
            self._report_lost(hold, "its lease was gone when checked")
        if hold.lost_reason is not None:
            raise self._lost_error(hold)

    def __enter__(self) -> Lock:
        claim = self.claim()
        if not claim.acquired:
            assert claim.refusal is not None
            raise claim.refusal
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

    def _settle(self) -> None:
        step = self._unsettled()
        if step is not None and step.flow is not None:
            try:
                self._released(step, run(step.flow, backend_of(step.alias)))
            except LockNotOwned:
                pass  # a loss, reported as such
            except RedisError as exc:
                raise self._release_failure(step, exc) from exc

    def _read(self, command: str) -> Any:
        alias, keys = self._alias_and_keys()
        try:
            return backend_of(alias).perform(Command((command, keys.lease)))
        except RedisError as exc:
            raise self._backend_error("read", exc) from exc

    # -- asynchronous API ----------------------------------------------------------------------

    async def aacquire(self, wait: float | None = None) -> bool:
        """``acquire()`` for asyncio: waits without blocking the event loop."""
        return (await self.aclaim(wait)).acquired

    async def aclaim(self, wait: float | None = None, *, want_result: bool = False) -> Claim:
        """``claim()`` for asyncio."""
        if self._release_failed:
            await self._asettle()
        pending = self._prepare(wait, want_result)
        if isinstance(pending, Claim):
            return pending
        backend = async_backend_for(async_lock_client(pending.alias))
        try:
            outcome = await arun(flows.acquire(pending.plan), backend)
        except (RedisError, flows.Unconfirmed) as exc:
            raise self._backend_error("acquire", exc) from exc
        return self._settled(pending, outcome)

    async def arelease(self, *, result: bytes | None = None, result_ttl: float = 0) -> None:
        """``release()`` for asyncio."""
        step = self._release_step(result, result_ttl)
        if step.flow is None:
            return
        try:
            code = await arun(step.flow, async_backend_for(async_lock_client(step.alias)))
        except RedisError as exc:
            raise self._release_failure(step, exc) from exc
        except BaseException as exc:  # a cancellation too
            self._release_failure(step, exc)
            raise
        self._released(step, code)

    async def aextend(self, seconds: float | None = None) -> None:
        """``extend()`` for asyncio."""
        step = self._extend_step(seconds)
        assert step.flow is not None
        try:
            extended = await arun(step.flow, async_backend_for(async_lock_client(step.alias)))
        except (RedisError, flows.Unconfirmed) as exc:
            raise self._backend_error("extend", exc) from exc
        self._extended(step, extended)

    async def __aenter__(self) -> Lock:
        claim = await self.aclaim()
        if not claim.acquired:
            assert claim.refusal is not None
            raise claim.refusal
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

    async def _asettle(self) -> None:
        step = self._unsettled()
        if step is not None and step.flow is not None:
            backend = async_backend_for(async_lock_client(step.alias))
            try:
                self._released(step, await arun(step.flow, backend))
            except LockNotOwned:
                pass
            except RedisError as exc:
                raise self._release_failure(step, exc) from exc


# The options Lock takes, which @lock(name, **options) and the others pass on to it.
LOCK_OPTIONS = keyword_names(Lock.__init__) - {"name"}
