"""The steps of a ``lock_many`` acquisition (``group.LockGroup``), and the two objects that
carry them out: one blocking, one for asyncio, each given to the drivers of
``backends/drivers.py`` as a flow's backend. The group decides the steps; these only do them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import RedisError

from ..backends import async_backend_of, backend_of
from ..backends.drivers import arun, run
from ..core.group import TakenInOrder, take_in_order
from ..exceptions import LockBackendError
from .claims import Pending
from .lock import Lock

__all__ = ["AsyncMembers", "ClaimOne", "Group", "Members", "Refresh", "TakeFree", "Undo"]


@dataclass(eq=False)
class TakeFree:
    """Take the free locks in one script, where one script can (``core/group.py``)."""

    wait: float
    taken: list[Lock]  # appended to as they are held


@dataclass(eq=False)
class ClaimOne:
    """Take one member, waiting up to ``wait`` seconds (its own ``claim()``)."""

    member: Lock
    wait: float


@dataclass(eq=False)
class Refresh:
    """Give a member taken earlier in this acquisition its whole lease again, from now (its own
    ``extend()``/``aextend()``): ``LockNotOwned`` when its lease ended while the acquisition
    waited for a later member."""

    member: Lock


@dataclass(eq=False)
class Undo:
    """Release a member this acquisition took (its own ``release()``/``arelease()``, which
    a cancellation does not cut short: ``Leased.arelease``)."""

    member: Lock


class Group(Protocol):
    """What the steps ask of the group they carry out (``LockGroup``'s seam): which members
    one script takes, what to hold once it took them, and the error to raise."""

    def prepared(self, step: TakeFree) -> list[tuple[Lock, Pending]]: ...

    def settle(
        self, step: TakeFree, pendings: list[tuple[Lock, Pending]], taken: TakenInOrder
    ) -> None: ...

    def backend_error(self, exc: BaseException) -> LockBackendError: ...


class Members:
    """Carries a group's steps out, blocking (``drivers.run``)."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def perform(self, step: Any) -> Any:
        if type(step) is ClaimOne:
            return step.member.claim(step.wait)
        if type(step) is Undo:
            step.member.release()
            return None
        if type(step) is Refresh:
            step.member.extend()
            return None
        pendings = self.group.prepared(step)
        if pendings:
            alias = pendings[0][1].alias
            pendings[0][0].before_acquiring()  # (as each member's claim() does: one alias)
            try:
                taken = run(take_in_order([p.plan for _, p in pendings]), backend_of(alias))
            except RedisError as exc:
                raise self.group.backend_error(exc) from exc
            self.group.settle(step, pendings, taken)
        return None


class AsyncMembers(Members):
    """:class:`Members` for asyncio (``drivers.arun``)."""

    async def perform(self, step: Any) -> Any:
        if type(step) is ClaimOne:
            return await step.member.aclaim(step.wait)
        if type(step) is Undo:
            await step.member.arelease()
            return None
        if type(step) is Refresh:
            await step.member.aextend()
            return None
        pendings = self.group.prepared(step)
        if pendings:
            backend = async_backend_of(pendings[0][1].alias)
            await pendings[0][0].abefore_acquiring()

            async def hold(taken: TakenInOrder) -> None:
                # Taken as the caller was cancelled: held, so that the group gives them back.
                self.group.settle(step, pendings, taken)

            try:
                flow = take_in_order([p.plan for _, p in pendings])
                taken = await arun(flow, backend, give_back=hold)
            except RedisError as exc:
                raise self.group.backend_error(exc) from exc
            self.group.settle(step, pendings, taken)
        return None
