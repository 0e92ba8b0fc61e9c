"""``lock_many``: several locks held together, all or nothing.

    with lock_many([f"account:{a.pk}", f"account:{b.pk}"]):
        ...                                    # both held, renewed together

The locks are taken in one canonical order (sorted by name), whatever order the caller gives,
so two callers naming the same locks in opposite orders never deadlock; the wait is one
deadline for them all. A lock someone else holds is waited for in line, as ``Lock`` waits,
holding those before it; on a timeout, an error or a cancellation, everything this acquisition
took is released before the caller hears of it. When every lock can be touched by one script
(one server, or names sharing a hash tag on a Redis Cluster: ``account:{bank-1}:42``), the
free ones are taken in one round trip (``take_many.lua``).

Each member is a plain :class:`~django_redis_lock.Lock`: renewed (together, in the watchdog's
batches), listed in the admin, released one by one. Losing any of them marks the whole hold
lost. The steps of an acquisition are one generator, carried out by the sync or the async
driver of ``backends/drivers.py``, so the two APIs cannot drift.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterable, Sequence
from types import TracebackType
from typing import Any

from ..backends import backend_of
from ..backends.drivers import arun, run
from ..conf import lock_settings
from ..core import durations
from ..core.group import TakenInOrder
from ..exceptions import LockBackendError, LockError, LockLost, LockNotAcquired, LockNotOwned
from ..hints import keyword_names
from . import errors
from .claims import Claim, Pending
from .group_steps import AsyncMembers, ClaimOne, Members, Refresh, TakeFree, Undo
from .lock import Lock

__all__ = ["GROUP_OPTIONS", "LockGroup", "lock_many"]

logger = logging.getLogger("django_redis_lock")


# -- the group ----------------------------------------------------------------------------------


class LockGroup:
    """Locks held together (see :func:`lock_many`); ``locks``: its members, in the order they
    are taken."""

    def __init__(
        self,
        names: Iterable[str],
        *,
        timeout: float | None = None,
        wait: float | None = None,
        auto_renew: bool | None = None,
        reentrant: bool = False,
        label: str | None = None,
        using: str | Sequence[str] | None = None,
        group: str | None = None,
    ) -> None:
        if isinstance(names, str | bytes) or not isinstance(names, Iterable):
            raise TypeError(
                f"lock_many() takes an iterable of lock names, not {type(names).__name__}"
                f"{' (one name: use Lock)' if isinstance(names, str) else ''}."
            )
        names = list(names)
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"A lock name must be a str, not {type(name).__name__}.")
        if not names:
            raise ValueError("lock_many() needs at least one lock name.")
        if wait is not None:
            wait = durations.seconds(wait, "wait", wait=True, allow_inf=True)
        options: dict[str, Any] = {
            "timeout": timeout, "wait": wait, "auto_renew": auto_renew,
            "reentrant": reentrant, "label": label, "using": using, "group": group,
        }  # fmt: skip
        self._locks = tuple(Lock(name, **options) for name in sorted(set(names)))
        self._options = options
        self._wait = wait
        self._one_script: bool | None = None  # found out on the first acquisition
        self.clock = time.monotonic

    def __repr__(self) -> str:
        held = " held" if self.held else ""
        return f"<LockGroup {list(self.names)!r}{held}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy is unheld, as a Lock's is.
        return (_group, (self.names, self._options))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(lock.name for lock in self._locks)

    @property
    def locks(self) -> tuple[Lock, ...]:
        return self._locks

    @property
    def held(self) -> bool:
        """Whether this thread/task holds the group (as far as this process knows)."""
        return all(lock.token is not None for lock in self._locks)

    @property
    def held_until(self) -> float | None:
        """Until when (``time.monotonic()`` seconds) this thread/task may act as the holder of
        every member (``Lock.held_until``, the soonest); None when it does not hold them all."""
        ends = [lock.held_until for lock in self._locks]
        return None if None in ends else min(e for e in ends if e is not None)

    @property
    def lost(self) -> bool:
        """True when any member's lease was found gone: the group is not held any more."""
        return any(lock.lost for lock in self._locks)

    def owned(self) -> bool:
        """Whether this thread/task holds every member right now (asks Redis)."""
        return all(lock.owned() for lock in self._locks)

    def ensure_held(self) -> None:
        """Raise ``LockLost`` unless Redis confirms we still hold every member."""
        for lock in self._locks:
            try:
                lock.ensure_held()
            except LockLost as error:
                raise LockLost(
                    f"The locks {list(self.names)!r} are not all held any more: {error}",
                    name=lock.name,
                ) from error

    # -- acquiring --------------------------------------------------------------------------------

    def acquire(self, wait: float | None = None) -> bool:
        """Take every lock, waiting up to ``wait`` seconds in all; True when all are held."""
        return self.claim(wait).acquired

    def claim(self, wait: float | None = None) -> Claim:
        """:meth:`acquire`, telling why not (``refusal`` names the lock that was held)."""
        claim: Claim = run(self._acquisition(wait), Members(self))
        return claim

    async def aacquire(self, wait: float | None = None) -> bool:
        """``acquire()`` for asyncio."""
        return (await self.aclaim(wait)).acquired

    async def aclaim(self, wait: float | None = None) -> Claim:
        """``claim()`` for asyncio; cancelled, it releases what it took first."""
        claim: Claim = await arun(self._acquisition(wait), AsyncMembers(self))
        return claim

    def _acquisition(self, wait: float | None) -> Generator[Any, Any, Claim]:
        if wait is not None:
            wait = durations.seconds(wait, "wait", wait=True, allow_inf=True)
        elif self._wait is not None:
            wait = self._wait
        else:
            wait = lock_settings.WAIT
        deadline = self.clock() + wait
        taken: list[Lock] = []
        left: dict[int, float] = {}  # a member's lease left when it was taken (s)
        try:
            if self._one_script is not False:
                yield TakeFree(wait, taken)
                left.update((id(member), self._left(member)) for member in taken)
            for member in self._locks:
                if member in taken:
                    continue
                claim = yield ClaimOne(member, max(0.0, deadline - self.clock()))
                if not claim.acquired:
                    yield from self._undo(taken)
                    return Claim(False, refusal=claim.refusal)
                taken.append(member)
                left[id(member)] = self._left(member)
            # A member taken early may have run through most of its lease, or all of it (a
            # fixed lease shorter than the wait for a later one, a pause) while a later one was
            # waited for: one with less than half of what it had left gets its lease again (as
            # Redisson's MultiLock does), or the group is not held: a lease that ended may be
            # another's by now. One reported lost meanwhile is not held either (its holder
            # stopped believing in it: lost stays lost, even if an extension would succeed).
            for member in taken:
                if member.lost:  # (reported lost meanwhile: a renewal that could not reach Redis)
                    yield from self._undo(taken)
                    return Claim(False, refusal=LockNotAcquired(member.name, waited=wait))
                now_left = self._left(member)
                if now_left == 0 or now_left < left[id(member)] / 2:
                    try:
                        yield Refresh(member)
                    except LockNotOwned:
                        taken.remove(member)
                        yield from self._undo(taken)
                        return Claim(False, refusal=LockNotAcquired(member.name, waited=wait))
            # A refresh learnt of only after the lease it gave had ended (its reply slower than
            # the lease) gives nothing to count on, and a member may run out while a later
            # one is refreshed: the group is held only while each member's lease is.
            ended = next((member for member in taken if self._left(member) == 0), None)
            if ended is not None:
                yield from self._undo(taken)
                return Claim(False, refusal=LockNotAcquired(ended.name, waited=wait))
        except GeneratorExit:
            raise
        except BaseException:
            yield from self._undo(taken)
            raise
        return Claim(True)

    @staticmethod
    def _left(member: Lock) -> float:
        """Seconds of ``member``'s lease left, by its own reckoning (0: none, or lost). On the
        monotonic clock the holds count by (the group's own clock times only its wait)."""
        until = member.held_until
        return 0.0 if until is None else max(0.0, until - time.monotonic())

    @staticmethod
    def _undo(taken: list[Lock]) -> Generator[Any, Any, None]:
        """Release what an acquisition that failed took, last first; a release that fails
        leaves its lease to end by itself (no longer renewed). Interrupted (cancelled again),
        it releases the others first, then lets the interruption through."""
        interrupted: BaseException | None = None
        for member in reversed(taken):
            try:
                yield Undo(member)
            except Exception as error:
                logger.warning("Could not give back lock %r: %s", member.name, error)
            except BaseException as error:
                interrupted = error
        if interrupted is not None:
            raise interrupted

    # The seam of group_steps.Members (public for it; not for callers).

    def prepared(self, step: TakeFree) -> list[tuple[Lock, Pending]]:
        """Each member's acquisition, planned; a re-entry is held already (``step.taken``).
        Empty when one script cannot take them (a Redis Cluster's slots, a quorum,
        ``MIN_REPLICAS``): each is then taken on its own."""
        pendings: list[tuple[Lock, Pending]] = []
        for member in self._locks:
            if member.release_unsettled:
                return []  # each member's claim() finishes that release first
        for member in self._locks:
            pending = member.plan_acquisition(step.wait)
            if isinstance(pending, Claim):
                step.taken.append(member)
            else:
                pendings.append((member, pending))
        if self._one_script is None and pendings:
            plans = [pending.plan for _, pending in pendings]
            backend = backend_of(pendings[0][1].alias)
            self._one_script = (
                len(self._locks) > 1
                and backend.queues
                and not plans[0].replicas
                and backend.one_script([plan.keys.lease for plan in plans])
            )
        return pendings if self._one_script else []

    def settle(
        self, step: TakeFree, pendings: list[tuple[Lock, Pending]], taken: TakenInOrder
    ) -> None:
        """Hold what the script took."""
        for (member, pending), acquired in zip(pendings, taken.acquired, strict=False):
            member.settle_acquisition(pending, acquired)
            step.taken.append(member)

    def backend_error(self, exc: BaseException) -> LockBackendError:
        return errors.backend_error(
            ", ".join(self.names), "acquire", exc, lock_settings.REPLICA_TIMEOUT
        )

    # -- releasing and extending ---------------------------------------------------------------

    def release(self) -> None:
        """Release every member, last first. Raises ``LockNotOwned`` when this thread/task
        holds none of them, or when one had been lost (the others are released all the same);
        ``LockBackendError`` when Redis failed a release (call ``release()`` again to retry
        those; the others stay released). Interrupted (``KeyboardInterrupt``), it releases the
        others first."""
        errors: list[BaseException] = []
        for member in self._held_members():
            try:
                member.release()
            except BaseException as error:
                errors.append(error)
        self._raise_first(errors)

    async def arelease(self) -> None:
        """``release()`` for asyncio; cancelled, it releases the others first, then lets the
        cancellation through."""
        errors: list[BaseException] = []
        for member in self._held_members():
            try:
                await member.arelease()
            except BaseException as error:
                errors.append(error)
        self._raise_first(errors)

    def extend(self, seconds: float | None = None) -> None:
        """Make every member's lease end ``seconds`` from now (default: its lease length)."""
        for member in self._locks:
            member.extend(seconds)

    async def aextend(self, seconds: float | None = None) -> None:
        """``extend()`` for asyncio."""
        for member in self._locks:
            await member.aextend(seconds)

    def _held_members(self) -> list[Lock]:
        held = [member for member in reversed(self._locks) if member.token is not None]
        if not held:
            raise LockNotOwned(
                f"The locks {list(self.names)!r} are not held by this thread/task through "
                "this group.",
                name=self._locks[0].name,
            )
        return held

    @staticmethod
    def _raise_first(errors: list[BaseException]) -> None:
        # An interruption first (it must get through), then a backend error: the one a retry
        # can fix; then a loss.
        def rank(error: BaseException) -> int:
            if not isinstance(error, Exception):
                return 0
            return 1 if isinstance(error, LockBackendError) else 2

        for error in sorted(errors, key=rank):
            raise error

    # -- with and async with ---------------------------------------------------------------------

    def __enter__(self) -> LockGroup:
        self.claim().raise_unless_acquired()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockError as error:
            self._exit_error(exc, error)

    async def __aenter__(self) -> LockGroup:
        (await self.aclaim()).raise_unless_acquired()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self.arelease()
        except LockError as error:
            self._exit_error(exc, error)

    def _exit_error(self, exc: BaseException | None, error: LockError) -> None:
        """A release at the end of a ``with`` block failed: say so without hiding ``exc``."""
        if exc is not None:
            logger.exception("Could not release the locks %r after an error", list(self.names))
        elif isinstance(error, LockNotOwned):
            raise LockLost(
                f"The locks {list(self.names)!r} were not all held to the end: {error}",
                name=error.name,
            ) from error
        else:
            raise error


def lock_many(
    names: Iterable[str],
    *,
    timeout: float | None = None,
    wait: float | None = None,
    auto_renew: bool | None = None,
    reentrant: bool = False,
    label: str | None = None,
    using: str | Sequence[str] | None = None,
    group: str | None = None,
) -> LockGroup:
    """The locks ``names``, to be held together: all or nothing (see :class:`LockGroup`). The
    options are :class:`~django_redis_lock.Lock`'s, for every member; ``wait`` is the longest
    wait for them all. Duplicate names count once; no name at all is a ``ValueError``."""
    return LockGroup(
        names, timeout=timeout, wait=wait, auto_renew=auto_renew, reentrant=reentrant,
        label=label, using=using, group=group,
    )  # fmt: skip


def _group(names: tuple[str, ...], options: dict[str, Any]) -> LockGroup:
    return LockGroup(names, **options)


# The options lock_many() takes (LockableModelMixin.lock_many passes them on).
GROUP_OPTIONS = keyword_names(LockGroup.__init__) - {"names"}
