"""The simulated clients' programs, made of the engine's own flows (``core/``): acquire, hold
(renewing), release; as ``Lock`` (plain, fenced, ``want_result``), ``Semaphore`` and
``lock_many`` drive them. A schedule's cast (how many clients, which options, when each
arrives, how long each works) is drawn from its choices too, so it shrinks with them.

Each program reports to the ledger what its client now believes (granted, renewed, released,
told it lost the lease), as the library's lock objects would act on the same outcomes.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django_redis_lock.core import flows
from django_redis_lock.core.flows import Acquired, AcquirePlan
from django_redis_lock.core.group import take_in_order
from django_redis_lock.core.lease import (
    LockKeys,
    OwnerRecord,
    holder_token,
    is_reservation,
    job_of,
    reservation_token,
    takeover_prefixes,
)
from django_redis_lock.core.permits import PermitKeys
from django_redis_lock.core.release import give_back, release_telling_first
from django_redis_lock.core.requests import Command, Request, Sleep
from django_redis_lock.core.uncontended import (
    STARVATION_BOUND_MS,
    learnt_late,
    reply_budget,
    take_free,
)

from .choices import Choices
from .clients import Client
from .ledger import Hold, LockFacts
from .server import NAMESPACE
from .simulation import Simulation
from .world import TAG

__all__ = ["WORKLOADS", "Role", "cast"]

WORKLOADS = ("lock", "fenced", "want_result", "semaphore", "many", "task")
PERMITS = 2  # a semaphore's limit
RESULT_TTL_MS = 60_000

Program = Generator[Request, Any, None]


@dataclass(frozen=True)
class Role:
    """One client's part in a schedule."""

    kind: str  # "lock", "semaphore", "many"; a task guard's "reserve", "run" or "cancel"
    names: tuple[str, ...]
    first: str = "set"
    fencing: bool = False
    want_result: bool = False
    renew: bool = False
    lease_ms: int = 3000
    wait_ms: int = 2000
    work_ms: int = 500
    rounds: int = 1
    job: str = ""  # a task guard's job id
    fair: bool = True


def lock_keys(name: str) -> LockKeys:
    return LockKeys.of(f"{NAMESPACE}{TAG}:{name}")


def permit_keys(name: str) -> PermitKeys:
    return PermitKeys.of(f"{NAMESPACE}{TAG}:{name}")


def cast(sim: Simulation, workload: str, choices: Choices) -> None:
    """Add ``workload``'s clients to ``sim``, drawn from ``choices``."""
    names = (
        ("a", "b", "c") if workload == "many" else ("s",) if workload == "semaphore" else ("a",)
    )
    for name in names:
        if workload == "semaphore":
            keys = permit_keys(name)
            facts = LockFacts(PERMITS, keys.lease, keys.queue, keys.waiters, None)
        else:
            lock = lock_keys(name)
            facts = LockFacts(1, lock.lease, lock.queue, lock.waiters, lock.result)
        sim.ledger.lock(name, facts)
    roles = _task_roles(choices, sim.backend.queues) if workload == "task" else []
    for index in range(len(roles) or choices.number(2, 4)):
        role = roles.pop(0) if roles else _role(workload, names, choices, sim.backend.queues)
        if role.first == "set" and workload == "lock" and sim.backend.queues and index % 2:
            # Every other plain client takes a free lock as Lock does (core/uncontended.py);
            # by its place, not by a draw: the schedules' draws stay as they were.
            role = replace(role, first="flat")
        if workload == "lock" and sim.backend.queues and index in (1, 3):
            # The second and the fourth: Lock(fair=False), release.lua's (two: one wakes the
            # other to compete). It never joins at once (its releases leave the lock free): a
            # plain one takes a free lock flat.
            first = "take" if role.fencing or role.want_result else "flat"
            role = replace(role, fair=False, first=first)
            if index == 3:
                # The releaser coming back for more: its work is shorter than the time a
                # waiter that lost the race to it takes to ask again on its own
                # (LOST_RACE_RETRY_MS), so its next release finds that waiter's mark.
                role = replace(role, work_ms=2)
            sim.ledger.locks[names[0]].unfair = True
        arrival = choices.pick((0, 0, 5, 400, 2500))
        sim.add(f"c{len(sim.clients) + 1}", _start(sim, role), arrival)


def _task_roles(choices: Choices, queues: bool) -> list[Role]:
    """A task guard's key: each job reserved when queued, then run once or more (a message
    delivered twice), and perhaps cancelled (revoked before it ran)."""
    roles: list[Role] = []
    for job in ("j1", "j2")[: choices.number(1, 2)]:
        common = {"names": ("a",), "job": job, "lease_ms": choices.pick((10_000, 3000))}
        roles.append(Role(kind="reserve", **common))
        for _ in range(choices.number(1, 2)):
            roles.append(Role(kind="run", renew=True, work_ms=choices.pick((500, 10, 4000)),
                              wait_ms=choices.pick((2000, 0, 8000) if queues else (500, 0)),
                              **common))  # fmt: skip
        if choices.chance(25):
            roles.append(Role(kind="cancel", **common))
    return roles


def _role(workload: str, names: tuple[str, ...], choices: Choices, queues: bool) -> Role:
    """(Without a queue, a waiter looks again every 5-30 ms: the longest waits and holds,
    hundreds of steps each, are left out.)"""
    fencing = workload == "fenced" or (workload == "lock" and choices.chance(20))
    want_result = workload == "want_result"
    first = "take" if fencing or want_result or workload == "semaphore" else "set"
    if choices.chance(25):
        first = "join"  # seen contended lately (Lock._first_try)
    members = names
    if workload == "many":
        members = tuple(sorted(set(choices.pick(((0, 1), (1, 2), (0, 1, 2), (0, 2))))))
        members = tuple(names[i] for i in members)
    return Role(
        kind="semaphore" if workload == "semaphore" else "many" if workload == "many" else "lock",
        names=members,
        first=first,
        fencing=fencing,
        want_result=want_result,
        renew=choices.chance(50),
        lease_ms=choices.pick((3000, 1000, 10_000)),
        wait_ms=choices.pick((2000, 0, 500, 8000) if queues else (500, 0, 1500)),
        work_ms=choices.pick((500, 10, 2500, 12_000) if queues else (500, 10, 1200)),
        rounds=choices.number(1, 2),
    )


def _start(sim: Simulation, role: Role) -> Any:
    def start(client: Client) -> Program:
        if role.kind == "many":
            return _many_program(sim, client, role)
        if role.kind in ("reserve", "run", "cancel"):
            return _task_program(sim, client, role)
        return _one_program(sim, client, role)

    return start


def _plan(sim: Simulation, client: Client, role: Role, keys: Any, token: str) -> AcquirePlan:
    """As ``Lock._prepare`` plans an acquisition."""
    record = OwnerRecord(role.lease_ms / 1000, 1, "sim", client.name).encode()
    started = sim.clock()
    queues = sim.backend.queues
    return AcquirePlan(
        keys=keys, token=token, lease_ms=role.lease_ms, record=record,
        max_wait=role.wait_ms / 1000, clock=sim.clock, queues=queues,
        first="take" if role.first == "join" and not queues else role.first,
        fencing=role.fencing, want_result=role.want_result, unfair=not role.fair,
        limit=PERMITS if role.kind == "semaphore" else 0, started=started,
        strays=client.strays.take(keys.lease, started), strayed=client.strays.left,
    )  # fmt: skip


def _acquire(sim: Simulation, client: Client, plan: AcquirePlan, lock: str, job: str = "") -> Any:
    """``flows.acquire``, reported; returns its :class:`Hold` when granted, else None."""
    deadline_us = round((plan.started + plan.max_wait) * 1e6)
    client.deadline_us, client.paused_while_acquiring = deadline_us, False
    try:
        if plan.first == "flat":
            outcome = yield from _flat(plan)
        else:
            outcome = yield from flows.acquire(plan)
    except Exception as error:  # (the Lock raises LockBackendError)
        client.notes.append(f"acquire failed: {error!r}")
        outcome = None
    sim.ledger.returned(client.name, deadline_us, client.paused_while_acquiring)
    client.deadline_us = None
    client.outcome = outcome
    if not isinstance(outcome, Acquired):
        return None
    return sim.ledger.granted(
        client.name, lock, plan.token, outcome.fence,
        round(outcome.sent_at * 1e6) + outcome.lease_ms * 1000,
        fenced=plan.fencing, want_result=plan.want_result, job=job,
    ), outcome  # fmt: skip


def _flat(plan: AcquirePlan) -> Any:
    """As ``Lock.claim`` goes (``Bookkeeping.quick_take``): one bare ``SET``, and a lock that
    was held (or granted too late to use) from the queue on, by the flows, with the same token
    and start."""
    reply = yield Command(
        take_free(plan.keys.lease, plan.token, plan.record, plan.lease_ms),
        reply_timeout=reply_budget(plan.max_wait), give_back=give_back(plan.keys, plan.token),
    )  # fmt: skip
    if reply is not None and not learnt_late(plan.started, plan.lease_ms, plan.clock()):
        return Acquired(0, plan.lease_ms, plan.started, "")
    return (yield from flows.acquire(replace(plan, first="join")))


def _one_program(sim: Simulation, client: Client, role: Role) -> Program:
    name = role.names[0]
    keys = permit_keys(name) if role.kind == "semaphore" else lock_keys(name)
    first_waiter = ""  # fair=False: the waiter its latest release woke (Bookkeeping)
    for round_ in range(role.rounds):
        plan = _plan(sim, client, role, keys, f"{client.name}.{round_}")
        granted = yield from _acquire(sim, client, plan, name)
        if granted is not None:
            hold, outcome = granted
            held = [(keys, hold, outcome)]
            if not (yield from _work(sim, role, held)):
                continue
            result = f"done-by-{plan.token}".encode() if role.want_result else None
            if role.fair:
                yield from _release(sim, held, result)
            else:
                first_waiter = yield from _release_unfair(sim, held[0], first_waiter)


def _many_program(sim: Simulation, client: Client, role: Role) -> Program:
    """As ``LockGroup`` acquires: the free ones in one script, then each in order; on a
    failure, what it took is released, last first."""
    for round_ in range(role.rounds):
        plans = [
            _plan(sim, client, role, lock_keys(name), f"{client.name}.{round_}.{name}")
            for name in role.names
        ]
        deadline = plans[0].started + plans[0].max_wait
        held: list[tuple[Any, Hold, Acquired]] = []
        together: list[Acquired] = []
        if sim.backend.queues and sim.backend.one_script([plan.keys.lease for plan in plans]):
            try:
                together = (yield from take_in_order(plans)).acquired
            except Exception as error:
                client.notes.append(f"take_many failed: {error!r}")
                continue
        for plan, acquired, name in zip(plans, together, role.names, strict=False):
            valid_until = round(acquired.sent_at * 1e6) + acquired.lease_ms * 1000
            hold = sim.ledger.granted(client.name, name, plan.token, 0, valid_until)
            held.append((plan.keys, hold, acquired))
        complete = True
        for plan, name in zip(plans[len(held) :], role.names[len(held) :], strict=True):
            wait = max(0.0, deadline - sim.clock())
            plan = replace(plan, max_wait=wait, started=sim.clock())
            granted = yield from _acquire(sim, client, plan, name)
            if granted is None:
                complete = False
                break
            hold, outcome = granted
            held.append((plan.keys, hold, outcome))
        if not complete:  # all or nothing: what it took is given back
            if (yield from _release(sim, held, None)):
                sim.ledger.none_held(client.name, [hold for _, hold, _ in held])
            continue
        if (yield from _work(sim, role, held)):
            yield from _release(sim, held, None)


def _work(sim: Simulation, role: Role, held: Sequence[tuple[Any, Hold, Acquired]]) -> Any:
    """Work for ``role.work_ms``, renewing as the watchdog would (each lease a third of the
    way, a lease handed over short at once); False when a renewal was told the lease is lost
    (the holder stops: ``LockLost``)."""
    work_end = sim.now_us + role.work_ms * 1000
    renewing = role.renew or any(o.lease_ms < role.lease_ms for _, _, o in held)
    every = min(min(o.lease_ms for _, _, o in held), role.lease_ms) * 1000 // 3
    while sim.now_us < work_end:
        yield Sleep((min(work_end, sim.now_us + every) - sim.now_us) / 1e6 if renewing
                    else (work_end - sim.now_us) / 1e6)  # fmt: skip
        if sim.now_us >= work_end or not renewing:
            break
        for keys, hold, _ in held:
            sent = round(sim.clock() * 1e6)  # (by its own clock, in whole ms: Simulation.clock)
            try:
                extended = yield from flows.extend(keys, hold.token, role.lease_ms)
            except Exception:  # (tried again next time)
                continue
            sim.ledger.renewed(hold, sent, role.lease_ms, extended)
            if not extended:
                return False
        renewing = role.renew
        every = role.lease_ms * 1000 // 3
    return True


def _release(
    sim: Simulation, held: Sequence[tuple[Any, Hold, Acquired]], result: bytes | None
) -> Any:
    """Release each, last first; whether every release got through."""
    released = True
    for keys, hold, outcome in reversed(held):
        sim.ledger.releasing(hold)
        keep: dict[str, Any] = {}
        if result is not None:
            keep = {"result": result, "result_ttl_ms": RESULT_TTL_MS}
        try:
            code = yield from flows.release(keys, hold.token, outcome.next_token, **keep)
        except Exception:  # (the Lock raises LockBackendError; the lease runs out)
            sim.ledger.ended(hold)
            released = False
            continue
        sim.ledger.released(hold, code)
    return released


def _release_unfair(sim: Simulation, held: tuple[Any, Hold, Acquired], first_waiter: str) -> Any:
    """As a ``Lock(fair=False)`` releases (``drivers.release``): expecting the waiter its
    latest release woke, if it has not been told of another; returns the waiter this one handed
    to or woke."""
    keys, hold, outcome = held
    sim.ledger.releasing(hold)
    try:
        code, first = yield from release_telling_first(
            keys, hold.token, outcome.next_token or first_waiter, unfair_ms=STARVATION_BOUND_MS
        )
    except Exception:  # (the Lock raises LockBackendError; the lease runs out)
        sim.ledger.ended(hold)
        return first_waiter
    sim.ledger.released(hold, code)
    return first


def _task_program(sim: Simulation, client: Client, role: Role) -> Program:
    """As ``reservations.reserve``, ``runs.GuardedRun`` and ``reservations.cancel`` do for a
    job."""
    keys, job = lock_keys(role.names[0]), role.job
    if role.kind == "cancel":
        try:
            code = yield from flows.end_reservation(keys, job)
        except Exception as error:  # (it may have got through)
            client.notes.append(f"cancel failed: {error!r}")
            code = None
        sim.ledger.reservation_ended(job, code)
        return
    plan = _plan(sim, client, role, keys, reservation_token(job))
    if role.kind == "reserve":  # never waits, never queues; nobody renews it
        plan = replace(plan, max_wait=0, first="set")
        yield from _acquire(sim, client, plan, role.names[0], job)
        return
    run = replace(
        plan, token=f"{job}~{client.name}", max_wait=0, first="take", want_result=True,
        job=True, takeover=takeover_prefixes(job),
    )  # fmt: skip
    granted = yield from _acquire(sim, client, run, role.names[0], job)
    holder = getattr(client.outcome, "holder", None)
    token = holder_token(holder) or ""
    if granted is None and job_of(token) == job and not is_reservation(token):
        # Another run of this very job (a copy): wait for it, and for its result.
        run = replace(run, max_wait=role.wait_ms / 1000, started=sim.clock(), first="join")
        granted = yield from _acquire(sim, client, run, role.names[0], job)
    if granted is not None:
        hold, outcome = granted
        held = [(keys, hold, outcome)]
        if (yield from _work(sim, role, held)):
            yield from _release(sim, held, job.encode())
