"""The ``tasks`` workload: the task guards' own code (``task_guards/``), as the Celery and
django.tasks integrations drive it, with the broker simulated.

A schedule draws one guard (its mode, its lease) and two or three calls of the task, some
with the same key. Each call is queued by a producer (``admit``: the key reserved, for the
modes that reserve it; a duplicate is dropped, as ``on_duplicate="skip"`` does), then
delivered to a worker at least once: a copy of the same job (its id) may be delivered to
another worker, at once or later (the broker's redelivery). Each delivery runs a
``GuardedRun``: ``enter()`` (or ``aenter()`` on an event loop), the body if the verdict is
``RUN``, ``exit()``. The body acts on the ledger through the run's lock (``run.lock``), as
``programs.py``'s clients do.

Checked beyond the ledger's rules (runs of one key apart, a job's copy not run again while
its id is kept, with ``job`` the job's id):

- **A copy told "finished" follows a run of its job that finished**, and with no fault, a
  copy delivered after a run of its job finished is not run (the modes that guard runs:
  ``until_executing`` guards only the queue); faults or not, once the job's record was seen
  kept, no copy of it runs while Redis loses nothing (later jobs of its key finish meanwhile:
  each job's record is its own).
- **No duplicate waits in the queue** (the modes that reserve): with no fault, a call of a
  key is not admitted while another call of that key is queued and has not started.
- **Redis answers**: no ``LockBackendError`` while no fault has happened.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass, field, replace
from typing import Any

from django_redis_lock import LockBackendError
from django_redis_lock.core.lease import reservation_token
from django_redis_lock.primitives.keys import lock_keys
from django_redis_lock.task_guards import (
    MODES,
    SKIP,
    GuardedRun,
    GuardNames,
    TaskGuard,
    Verdict,
    admit,
)

from ..choices import Choices
from ..ledger import LockFacts
from .programs import (
    Role,
    async_process,
    async_work,
    held,
    in_slot,
    plan_crash,
    stop_acting,
    work,
)
from .threads import Interrupted

__all__ = ["cast_tasks"]

TASK = "sim.task"
KEYS = ("k1", "k1", "k2")
POLL_S = 0.01  # how often a delivery looks whether its call was queued yet
# When a call is delivered, ms after it was queued; and a copy of it (the broker's redelivery:
# at once, or long after, when later calls of its key may have run and finished too).
DELIVERED_MS = (0, 5, 400, 2500)
REDELIVERED_MS = (0, 5, 400, 2500, 8000)


def _task(key: str) -> None:
    """The task's signature (its key is made of ``key``)."""


@dataclass(eq=False)
class _Call:
    job: str
    key: str
    names: GuardNames
    queued: bool | None = None  # None: not yet decided by its producer
    producer: Any = None  # its producer's process (a crashed one never decides)
    started: bool = False  # a delivery of it entered (which ends its reservation, if any)
    finished: bool = False  # a run of it finished
    recorded: int | None = None  # Redis' data losses when its record was seen kept (None: not)


@dataclass(eq=False)
class _Broker:
    """One schedule's guard and calls."""

    sim: Any
    guard: TaskGuard
    role: Role
    calls: list[_Call] = field(default_factory=list)

    # -- the producer ----------------------------------------------------------------------

    def produce(self, client: str, call: _Call) -> None:
        sim = self.sim
        if not self.guard.reserves:
            call.queued = True
            return
        assert call.names.queue is not None
        try:
            duplicate = admit(self.guard, call.names, call.job, ttl=self.guard.queued_ttl())
        except (LockBackendError, Interrupted) as error:
            self.failed(client, error)  # (the call is not queued: its producer says so)
            call.queued = False
            return
        call.queued = duplicate is None
        sim.trace.add(sim.now_us, client, f"{call.job} {'queued' if call.queued else 'dropped'}")
        # (Those still waiting once it is queued: one that started meanwhile ended its
        # reservation, perhaps before this call took it.)
        waiting = [
            other for other in self.calls
            if other is not call and other.key == call.key and other.queued and not other.started
        ]  # fmt: skip
        if call.queued and waiting and sim.ledger.faults == 0:
            sim.ledger.fail(f"{call.job} was queued while {waiting[0].job}, of the same key, "
                            "waited in the queue")  # fmt: skip

    # -- a delivery ------------------------------------------------------------------------------

    def delivery(self, call: _Call) -> tuple[GuardedRun, int, int]:
        """A delivery of ``call`` begins (which ends its reservation, if any): its run, when
        it began, and the ledger's data losses then."""
        call.started = True
        return (
            GuardedRun(self.guard, call.names, call.job),
            self.sim.now_us,
            self.sim.ledger.losses,
        )

    def entered(
        self, client: str, call: _Call, run: GuardedRun, verdict: Verdict, started: int,
        losses: int,
    ) -> list[Any] | None:  # fmt: skip
        """``run.enter()`` said ``verdict``: checked, and what the run's body holds, told to
        the ledger (empty: a mode with no run lock, whose runs may overlap), or None: it does
        not run (what it does instead told to the world, as the integrations tell it)."""
        sim = self.sim
        sim.trace.add(sim.now_us, client, f"{call.job}: {verdict.value}")
        if verdict is Verdict.FINISHED and not call.finished:
            sim.ledger.fail(f"{client} was told {call.job} had finished, and no run of it had")
        if verdict is Verdict.RUN and call.finished and run.lock and sim.ledger.faults == 0:
            sim.ledger.fail(f"{client} ran {call.job} again: a run of it had finished")
        if verdict is Verdict.RUN and call.recorded == sim.ledger.losses:
            sim.ledger.fail(f"{client} ran {call.job} again: its record was kept")
        if verdict is not Verdict.RUN:
            action = run.refused(verdict, sender=GuardedRun)
            sim.trace.add(sim.now_us, client, f"{call.job}: {action}")
            return None
        if run.lock is None:
            return []
        role = replace(self.role, names=(run.lock.name,))
        holds = held(sim, client, run.lock, role, True, started, losses, job=call.job)
        assert holds is not None
        return holds

    def end(self, holds: list[Any], call: _Call) -> None:
        """The run's body is over (then its key is released, the job's id left)."""
        stop_acting(self.sim, holds)
        call.finished = True

    def exited(self, call: _Call, run: GuardedRun) -> None:
        """``run.exit()`` returned: once its job's record is kept, no copy of the job runs
        (faults or not, as long as Redis loses nothing)."""
        if run.lock is None:
            return
        keys = lock_keys(run.lock.name, self.sim.alias)
        kept = self.sim.ledger.state.value(keys.result_of(reservation_token(call.job)))
        if kept == call.job:
            call.recorded = self.sim.ledger.losses

    def failed(self, client: str, error: BaseException, call: _Call | None = None) -> None:
        """``call``'s run failed to enter (``error``): its key is the job's (the run may have
        taken the job's reservation over: no give-back), so what it took is left to its lease,
        as a run that died leaves it, and a copy takes over after it."""
        sim = self.sim
        sim.trace.add(sim.now_us, client, f"failed: {error!r}")
        if call is not None:
            sim.unreleased_jobs.add(call.job)
        if sim.ledger.faults == 0 and isinstance(error, LockBackendError):
            sim.ledger.fail(f"{client} could not reach Redis with no fault: {error!r}")


def cast_tasks(sim: Any, choices: Choices, *, asynchronous: bool = True) -> None:
    mode = choices.pick(MODES)
    lease = choices.pick((None, 1, 3))
    guard = TaskGuard(
        TASK, _task, label="simulated task", guard=mode, guard_key=in_slot(sim, "{key}"),
        on_duplicate=SKIP, guard_timeout=lease,
    )  # fmt: skip
    work_ms = choices.pick((10, 500, 2500))
    role = Role(
        kind="lock", names=("",), want_result=True, lease_ms=round(guard.lease * 1000),
        wait_ms=round(guard.copy_wait() * 1000), work_ms=work_ms,
    )  # fmt: skip
    broker = _Broker(sim, guard, role)
    for index in range(choices.number(2, 3)):
        key = choices.pick(KEYS)
        call = _Call(f"j{index + 1}", key, guard.names((), {"key": key}))
        broker.calls.append(call)
        for name in dict.fromkeys(n for n in (call.names.queue, call.names.run) if n):
            if name not in sim.ledger.locks:
                keys = lock_keys(name, sim.alias)
                facts = LockFacts(1, keys.lease, keys.queue, keys.waiters, keys.result)
                sim.ledger.lock(name, facts)
    for call in broker.calls:
        queued_at = choices.pick((0, 0, 5, 400))
        producer = f"q{call.job[1:]}"
        call.producer = sim.process()
        sim.add_client(producer, call.producer, functools.partial(broker.produce, producer, call),
                       queued_at)  # fmt: skip
        for copy in range(choices.pick((1, 1, 2))):  # (a copy: the broker delivered it again)
            client = f"w{call.job[1:]}{'abc'[copy]}"
            process = sim.process()
            arrival = queued_at + choices.pick(REDELIVERED_MS if copy else DELIVERED_MS)
            plan_crash(sim, process, choices, arrival)
            if asynchronous and choices.chance(40):
                program = functools.partial(_task_run, broker, process, client, call, arrival)
                sim.add_client(client, process, async_process(sim, [(client, program)]), 0)
            else:
                program = functools.partial(_thread_run, broker, process, client, call)
                sim.add_client(client, process, program, arrival)


def _deciding(call: _Call) -> bool:
    """Whether ``call``'s producer may still queue it."""
    return call.queued is None and not call.producer.crashed


def _thread_run(broker: _Broker, process: Any, client: str, call: _Call) -> None:
    """A worker's delivery of ``call``, in a thread (as Celery's prefork or thread pool)."""
    sim = broker.sim
    while _deciding(call):  # (its producer has not queued it yet)
        time.sleep(POLL_S)
    if not call.queued:
        return
    run, started, losses = broker.delivery(call)
    process.acquiring += 1
    try:
        verdict = run.enter()
    except (LockBackendError, Interrupted) as error:
        broker.failed(client, error, call)
        return
    finally:
        process.acquiring -= 1
    holds = broker.entered(client, call, run, verdict, started, losses)
    if holds is None:
        return
    try:  # (as the integrations run the body: its end, however it ends, leaves the job's id)
        if holds:
            work(sim, run.lock, holds, broker.role)
        else:
            time.sleep(broker.role.work_ms / 1000)
    finally:
        broker.end(holds, call)
        try:
            run.exit()
        except Interrupted as error:
            broker.failed(client, error)
        else:
            broker.exited(call, run)


async def _task_run(
    broker: _Broker, process: Any, client: str, call: _Call, arrival_ms: int
) -> None:
    """A worker's delivery of ``call`` as a task of an event loop (an async task's run)."""
    sim = broker.sim
    await asyncio.sleep(arrival_ms / 1000)
    while _deciding(call):
        await asyncio.sleep(POLL_S)
    if not call.queued:
        return
    run, started, losses = broker.delivery(call)
    process.acquiring += 1
    try:
        verdict = await run.aenter()
    except LockBackendError as error:
        broker.failed(client, error, call)
        return
    finally:
        process.acquiring -= 1
    holds = broker.entered(client, call, run, verdict, started, losses)
    if holds is None:
        return
    try:
        if holds:
            await async_work(sim, run.lock, holds, broker.role)
        else:
            await asyncio.sleep(broker.role.work_ms / 1000)
    finally:
        broker.end(holds, call)
        await run.aexit()
        broker.exited(call, run)
