"""What the simulated clients run: our public API, called as a user's code calls it.

Each client is a thread of a simulated process of its own. It takes the lock (``Lock``,
``Semaphore`` or ``lock_many``, with options drawn from the schedule's choices), works while
it believes it holds it, and releases it. Working is acting on the guarded resource at
intervals, each time after checking ``held_until`` (the library's own word on how long it may
still act): the ledger (``../ledger.py``) is told of each act with that belief, and fails the
schedule when two clients' beliefs overlap past the lock's limit.

Nothing of the library is restated here: the waits, the renewals, the give-backs are its own.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from django_redis_lock import (
    Lock,
    LockBackendError,
    LockError,
    LockNotOwned,
    Semaphore,
    aclose_async_redis_clients,
    lock_many,
)
from django_redis_lock.core.durations import clock_allowance
from django_redis_lock.primitives.keys import lock_keys, permit_keys

from ..choices import Choices
from ..ledger import LockFacts
from .aio import SimulatedEventLoop
from .threads import Interrupted

__all__ = [
    "ARRIVALS_MS", "RETURN_US", "WORKLOADS", "Role", "async_process", "async_work", "cast", "held",
    "in_slot", "plan_crash", "release_failed", "stop_acting", "work",
]  # fmt: skip

WORKLOADS = ("lock", "fair", "semaphore", "many", "want_result", "async")
PERMITS = 2  # a semaphore's limit (or 1: a line forms more often)
TAG = "{sim}"  # every name's keys in one hash slot, and the scripts' clock of that tag
# How late an acquisition may return after its wait ran out, with no fault: the steps of its
# last requests (stepping out of the line), each a microsecond of simulated time, and the other
# clients' steps the schedule puts between them. No slack beyond that: the blocking waits'
# lengths are exact in simulated time.
RETURN_US = 100
# A client's lease, ms; a group's may be short too (half a second: a member's renewals fail
# for a lease's length more often while the group waits for another member).
LEASES_MS = (3000, 1000, 10_000)
MANY_LEASES_MS = (3000, 1000, 10_000, 500)
# When a client arrives, in ms after the schedule starts: together, just after, in line, late.
ARRIVALS_MS = (0, 0, 5, 400, 2500)


@dataclass(frozen=True)
class Role:
    kind: str  # "lock", "semaphore", "many"
    names: tuple[str, ...]
    fencing: bool = False
    fair: bool = True
    renew: bool = False
    lease_ms: int = 3000
    wait_ms: int = 2000
    work_ms: int = 500
    rounds: int = 1
    limit: int = 1  # a semaphore's permits
    # claim(want_result=True), release(result=...): the guards' way (double submit, run once)
    want_result: bool = False
    # extend() by hand while working, when a third of the lease is left (a long loop's way)
    extends: bool = False


def cast(sim: Any, workload: str, choices: Choices) -> None:
    """Add ``workload``'s clients to ``sim``, drawn from ``choices``. ``async``: tasks of
    event loops, on a lock, a semaphore or a group (drawn too)."""
    kinds = ("fair", "semaphore", "many", "want_result")
    kind = choices.pick(kinds) if workload == "async" else workload
    names = {"many": ("a", "b", "c"), "semaphore": ("s",)}.get(kind, ("a",))
    limit = choices.pick((PERMITS, 1)) if kind == "semaphore" else 1
    for name in names:
        full = TAG + name
        if kind == "semaphore":
            permits = permit_keys(full, sim.alias)
            facts = LockFacts(limit, permits.lease, permits.queue, permits.waiters, None)
        else:
            keys = lock_keys(full, sim.alias)
            facts = LockFacts(1, keys.lease, keys.queue, keys.waiters, keys.result)
        sim.ledger.lock(full, facts)
    if workload == "async":
        _cast_async(sim, kind, names, choices, limit)
        return
    for index in range(choices.number(2, 4)):
        role = _role(workload, names, choices, limit)
        if workload == "lock" and index in (1, 3):
            role = replace(role, fair=False)
            sim.ledger.locks[TAG + names[0]].unfair = True
        process = sim.process()
        name = f"c{index + 1}"
        arrival = choices.pick(ARRIVALS_MS)
        plan_crash(sim, process, choices, arrival)
        sim.add_client(name, process, _program(sim, process, name, role), arrival)


def _cast_async(sim: Any, kind: str, names: tuple[str, ...], choices: Choices, limit: int) -> None:
    """Two to four clients, one or two to a process (its event loop's tasks)."""
    count, index = choices.number(2, 4), 0
    while index < count:
        process = sim.process()
        tasks = []
        for _ in range(min(choices.number(1, 2), count - index)):
            index += 1
            arrival = choices.pick(ARRIVALS_MS)
            tasks.append((f"c{index}", _role(kind, names, choices, limit), arrival))
        plan_crash(sim, process, choices, min(arrival for _, _, arrival in tasks))
        loop = "+".join(name for name, _, _ in tasks)
        programs = [
            (name, functools.partial(_async_program, sim, process, name, role, arrival))
            for name, role, arrival in tasks
        ]  # fmt: skip
        sim.add_client(loop, process, async_process(sim, programs), 0)


def in_slot(sim: Any, text: str) -> str:
    """``text`` (a name or a guard's key) with the simulation's hash tag on a Cluster, so that
    every key of the schedule is in the slot its world watches; elsewhere as it is. Braces
    doubled: a guard's key is a format string."""
    return "{{sim}}" + text if sim.world.name == "cluster" else text


def plan_crash(sim: Any, process: Any, choices: Choices, arrival: int) -> None:
    if choices.chance(20):  # (a crash planned a while after it arrives: often in line)
        process.crash_at_us = sim.now_us + (arrival + choices.pick((5, 300, 1500))) * 1000


def _role(workload: str, names: tuple[str, ...], choices: Choices, limit: int) -> Role:
    members = names
    if workload == "many":
        picked = choices.pick(((0, 1), (1, 2), (0, 1, 2), (0, 2)))
        members = tuple(names[i] for i in picked)
    return Role(
        kind="semaphore" if workload == "semaphore" else "many" if workload == "many" else "lock",
        names=members,
        fencing=workload in ("lock", "fair", "want_result") and choices.chance(30),
        want_result=workload == "want_result",
        renew=choices.chance(50),
        lease_ms=choices.pick(MANY_LEASES_MS if workload == "many" else LEASES_MS),
        wait_ms=choices.pick((2000, 0, 500, 8000)),
        work_ms=choices.pick((500, 10, 2500, 12_000)),
        rounds=choices.number(1, 2),
        limit=limit,
        extends=choices.chance(25),
    )


def _primitive(role: Role) -> Any:
    options: dict[str, Any] = {
        "timeout": role.lease_ms / 1000, "wait": role.wait_ms / 1000, "auto_renew": role.renew,
    }  # fmt: skip
    names = [TAG + name for name in role.names]
    if role.kind == "semaphore":
        return Semaphore(names[0], role.limit, **options)
    if role.kind == "many":
        return lock_many(names, **options)
    return Lock(names[0], fencing=role.fencing, fair=role.fair, **options)


def _program(sim: Any, process: Any, client: str, role: Role) -> Any:
    ledger = sim.ledger

    def run() -> None:
        primitive = _primitive(role)
        for _ in range(role.rounds):
            started, losses = sim.now_us, ledger.losses
            process.acquiring += 1
            try:
                acquired = _acquired(sim, client, primitive.claim(**_wanted(role)))
            except (LockBackendError, Interrupted) as error:
                sim.trace.add(sim.now_us, client, f"acquire failed: {error!r}")
                continue
            finally:
                process.acquiring -= 1
            holds = held(sim, client, primitive, role, acquired, started, losses)
            if holds is None:
                continue
            work(sim, primitive, holds, role)
            stop_acting(sim, holds)
            try:
                primitive.release(**_result(client, role))
            except (LockNotOwned, LockBackendError, Interrupted) as error:
                release_failed(sim, client, holds, error)

    return run


def async_process(
    sim: Any, programs: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]
) -> Any:
    """One process's event loop (``aio.py``), its clients tasks of it (``programs``: each
    client's name and what makes its coroutine). A lock's client does as a user's coroutine
    does: ``aclaim()`` (``aacquire()``, or the guards' ``want_result``), the work
    (``asyncio.sleep``), ``arelease()`` in a ``finally`` (a cancellation while it works
    releases)."""

    async def main(loop: SimulatedEventLoop) -> None:
        tasks = [loop.create_task(program(), name=name) for name, program in programs]
        loop.clients.extend(tasks)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await aclose_async_redis_clients()
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(
                outcome, asyncio.CancelledError
            ):
                raise outcome

    def run() -> None:
        loop = SimulatedEventLoop(sim.scheduler)
        try:
            loop.run_until_complete(main(loop))
            loop.run_until_complete(loop.shutdown_asyncgens())  # (as asyncio.run ends a loop)
        finally:
            loop.close()

    return run


async def _async_program(sim: Any, process: Any, client: str, role: Role, arrival: int) -> None:
    ledger = sim.ledger
    await asyncio.sleep(arrival / 1000)
    primitive = _primitive(role)
    for _ in range(role.rounds):
        started, losses = sim.now_us, ledger.losses
        process.acquiring += 1
        try:
            claim = await primitive.aclaim(**_wanted(role))
            acquired = _acquired(sim, client, claim)
        except LockBackendError as error:
            sim.trace.add(sim.now_us, client, f"acquire failed: {error!r}")
            continue
        except asyncio.CancelledError:
            sim.trace.add(sim.now_us, client, "cancelled while it acquires")
            raise
        finally:
            process.acquiring -= 1
        holds = held(sim, client, primitive, role, acquired, started, losses)
        if holds is None:
            continue
        try:
            await async_work(sim, primitive, holds, role)
        finally:
            stop_acting(sim, holds)
            try:
                await primitive.arelease(**_result(client, role))
            except (LockNotOwned, LockBackendError) as error:
                release_failed(sim, client, holds, error)


def held(
    sim: Any, client: str, primitive: Any, role: Role, acquired: bool, started: int, losses: int,
    *, job: str = "",
) -> list[Any] | None:  # fmt: skip
    """What an acquisition that returned ``acquired`` holds, told to the ledger (None: it
    holds nothing); each check of its return on the way. ``job``: a task's run, whose job's
    id is the result it leaves (the ledger: not run again while that is kept)."""
    ledger = sim.ledger
    if sim.ledger.faults == 0 and sim.now_us > started + role.wait_ms * 1000 + RETURN_US:
        ledger.fail(f"{client}'s acquisition returned "
                    f"{(sim.now_us - started - role.wait_ms * 1000) / 1000:.3f} ms "
                    "after its wait ran out")  # fmt: skip
    if not acquired:
        sim.trace.add(sim.now_us, client, "not acquired")
        return None
    _check_in_time(sim, client, primitive, role)
    holds = [
        ledger.granted(client, name, _token(lock), getattr(lock, "fencing_token", 0) or 0,
                       _until_us(primitive), fenced=role.fencing, losses=losses,
                       want_result=role.want_result, job=job)
        for name, lock in _members(primitive, role)
    ]  # fmt: skip
    sim.trace.add(sim.now_us, client, "holds " + ", ".join(h.lock for h in holds))
    return holds


def stop_acting(sim: Any, holds: list[Any]) -> None:
    """The work under ``holds`` is over (then they are released)."""
    for hold in holds:
        sim.ledger.releasing(hold)


def release_failed(sim: Any, client: str, holds: list[Any], error: BaseException) -> None:
    sim.trace.add(sim.now_us, client, f"release failed: {error!r}")
    sim.unreleased.update(hold.token for hold in holds)  # (they run out)


def _acquired(sim: Any, client: str, claim: Any) -> bool:
    if claim.result is not None:  # (the work was done: the guards answer with its result)
        sim.trace.add(sim.now_us, client, f"found the work done: {claim.result!r}")
    return bool(claim.acquired)


def _wanted(role: Role) -> dict[str, Any]:
    return {"want_result": True} if role.want_result else {}


def _result(client: str, role: Role) -> dict[str, Any]:
    """What a release leaves for the duplicates (the guards' result), if anything."""
    if not role.want_result:
        return {}
    return {"result": f"done-by-{client}".encode(), "result_ttl": 60}


def _check_in_time(sim: Any, client: str, primitive: Any, role: Role) -> None:
    """An acquisition that says "held" holds a lease that has not ended by its holder's own
    reckoning (``held_until`` is that end less the allowance for Redis's clock): to the
    microsecond, with no slack."""
    until = primitive.held_until
    ends_us = None if until is None else until * 1e6 + clock_allowance(role.lease_ms / 1000) * 1e6
    if ends_us is None or ends_us <= sim.now_us:
        sim.ledger.fail(f"{client}'s acquisition said it held the lock, whose lease had "
                        "ended by its own reckoning")  # fmt: skip


def _members(primitive: Any, role: Role) -> list[tuple[str, Any]]:
    if role.kind == "many":
        return [(lock.name, lock) for lock in primitive.locks]
    return [(primitive.name, primitive)]


def _token(lock: Any) -> str:
    return lock.token or ""


def _until_us(primitive: Any) -> int:
    until = primitive.held_until
    return 0 if until is None else int(until * 1e6)


def work(sim: Any, primitive: Any, holds: list[Any], role: Role) -> None:
    """Act on the resource every sixth of the lease, while the lock says it may; with
    ``role.extends``, ``extend()`` when a third of the lease is left, then act at once on the
    lease it gave (a lease the extension found another's must stop the acts)."""
    end = sim.now_us + role.work_ms * 1000
    while (pause := _act(sim, primitive, holds, role, end)) is not None:
        if _extend_due(sim, primitive, role):
            try:
                primitive.extend()
            except (LockError, Interrupted) as error:
                _extend_failed(sim, holds, error)
                return
            continue
        time.sleep(pause)


async def async_work(sim: Any, primitive: Any, holds: list[Any], role: Role) -> None:
    end = sim.now_us + role.work_ms * 1000
    while (pause := _act(sim, primitive, holds, role, end)) is not None:
        if _extend_due(sim, primitive, role):
            try:
                await primitive.aextend()
            except LockError as error:
                _extend_failed(sim, holds, error)
                return
            continue
        await asyncio.sleep(pause)


def _extend_due(sim: Any, primitive: Any, role: Role) -> bool:
    return role.extends and _until_us(primitive) - sim.now_us <= role.lease_ms * 1000 // 3


def _extend_failed(sim: Any, holds: list[Any], error: BaseException) -> None:
    """The work stops: the lease is another's (or may be)."""
    sim.trace.add(sim.now_us, holds[0].client if holds else "", f"extend failed: {error!r}")


def _act(sim: Any, primitive: Any, holds: list[Any], role: Role, end: int) -> float | None:
    """One act on the resource, if the lock says it may still act; the pause until the next
    (every sixth of the lease), or None: the work is over."""
    if sim.now_us >= end:
        return None
    until = _until_us(primitive)
    if until <= sim.now_us:
        return None  # lost, or its lease ran out by its own reckoning: it stops acting
    for hold in holds:
        sim.ledger.acted(hold, until)
    return min(max(1, role.lease_ms // 6) / 1000, (end - sim.now_us) / 1e6)
