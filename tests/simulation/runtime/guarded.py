"""The ``guards`` workload: the guards' own code as users run it, under the scheduler.

Clients are people. Each submits an order to a view guarded by ``@prevent_double_submit``
(built with ``RequestFactory``, called as Django calls a view), or runs a job guarded by
``@run_once``; sync in a thread, or async as a task of an event loop (``aio.py``). What the
guard does (who the client is, the fingerprint, the lock, the wait, the kept response, its
replay, the budget it is charged to) is the library's own; only the view's and job's bodies
are the simulation's, and they act on the ledger as ``programs.py``'s clients do, through the
lock the guard took (learnt from the public ``lock_acquired`` signal).

Checked beyond the ledger's rules (no overlap, no double run while a result is kept):

- **No response reaches anyone else**: a replayed response is one a body gave, for the same
  person and the same order. The identity is personal (the person) or shared (their office:
  two people present it): a shared identity's duplicate is never replayed anything.
- **A duplicate was run**: a ``run_once`` call told "done" follows a body that finished.
- **Redis answers**: no 503 and no error from a guard while no fault has happened.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from django_redis_lock import (
    LockBackendError,
    LockError,
    PersonalIdentity,
    lock_acquired,
    prevent_double_submit,
    run_once,
)
from django_redis_lock.conf import lock_settings
from django_redis_lock.guards.submissions import request_fingerprint, submission_lock_name
from django_redis_lock.primitives.keys import lock_keys

from ..choices import Choices
from ..ledger import LockFacts
from .programs import (
    ARRIVALS_MS,
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

__all__ = ["cast_guards"]

GROUP = "sim.order"
# The tag of the guards' budgets of kept responses (``keys.replay_budget_key``): their own
# Cluster slot, given a clock there (a wrong one fails every guards schedule on a Cluster).
REPLAY_BUDGET_TAG = "{!replay-budget}"
PEOPLE = ("ann", "bob", "cy")
OFFICE = {"ann": "office-a", "bob": "office-a", "cy": "office-b"}  # ann and bob share one
ITEMS = ("book", "pen")
IDEMPOTENCY_KEYS = ("k1", "k2", None)
JOBS = ("j1", "j2")
PATH = "/order/"

# The lock each thread or task of the schedule took last (the ``lock_acquired`` signal's), for
# the body it runs next: the guard keeps its lock to itself. Weakly: the guard holds it while
# the body runs, and a lock is not kept alive by being seen here.
_acquired: dict[Any, weakref.ref[Any]] = {}


def _holder() -> Any:
    try:
        return asyncio.current_task() or threading.get_ident()
    except RuntimeError:  # no event loop in this thread
        return threading.get_ident()


def _remember(sender: Any, lock: Any, **kwargs: Any) -> None:
    _acquired[_holder()] = weakref.ref(lock)


class _Guards:
    """One schedule's guarded view and job, drawn from its choices, and what they gave."""

    def __init__(self, sim: Any, choices: Choices) -> None:
        self.sim = sim
        self.personal = choices.chance(50)
        self.idempotency = choices.chance(30)
        self.wait = choices.pick((None, 0, 2))
        self.timeout = choices.pick((None, None, 1))
        self.hold = choices.pick((5, 0.5))
        self.ttl = choices.pick((60, 0.5))
        self.work_ms = choices.pick((10, 500, 2500))
        self.failing = choices.chance(20)  # some bodies fail: nothing is kept, a retry runs
        self.given: set[bytes] = set()  # the responses the bodies gave (status < 500)
        self.finished: set[str] = set()  # the jobs whose body finished
        self.processes: dict[str, Any] = {}  # each client's
        lease = self.timeout or lock_settings.TIMEOUT
        # The longest a guard's duplicate waits: its ``wait``, else (prevent_double_submit's
        # default for a person's duplicate) 10 s.
        wait = 10 if self.wait is None else self.wait
        self.role = Role(
            kind="lock", names=("",), want_result=True, lease_ms=round(lease * 1000),
            wait_ms=round(wait * 1000), work_ms=self.work_ms,
        )  # fmt: skip
        # (On a Cluster, in the schedule's slot: programs.in_slot.)
        self.group = in_slot(sim, GROUP).format()
        once = in_slot(sim, "job:{job}")
        self.view = self._guarded_view()
        self.job = run_once(once, ttl=self.ttl, wait=self.wait)(self._job_body)
        self.async_view = self._guarded_view(asynchronous=True)
        self.async_job = run_once(once, ttl=self.ttl, wait=self.wait)(self._async_job_body)
        _acquired.clear()
        # (Connected by the first schedule of the guards, in a process that runs schedules.)
        lock_acquired.connect(_remember, weak=False, dispatch_uid="simulation-guards")
        for name in self._lock_names():
            keys = lock_keys(name, sim.alias)
            sim.ledger.lock(name, LockFacts(1, keys.lease, keys.queue, keys.waiters, keys.result))

    # -- who and what ---------------------------------------------------------------------------

    def identity(self, request: HttpRequest) -> str:
        person = request.headers["X-Person"]
        return PersonalIdentity(person) if self.personal else OFFICE[person]

    def request(self, person: str, item: str, key: str | None) -> HttpRequest:
        headers = {"X-Person": person, **({"Idempotency-Key": key} if key else {})}
        return RequestFactory().post(PATH, {"item": item}, headers=headers)

    def _lock_names(self) -> list[str]:
        """Every lock a request or job of the schedule may take (the ledger watches each)."""
        names = {"once:" + in_slot(self.sim, "job:{job}").format(job=job) for job in JOBS}
        scope = "personal" if self.personal else "shared"
        for person in PEOPLE:
            identity = self.identity(self.request(person, ITEMS[0], None))
            for item in ITEMS:
                fingerprint = request_fingerprint(self.request(person, item, None))
                names.add(submission_lock_name(self.group, scope, identity, fingerprint))
            for key in filter(None, IDEMPOTENCY_KEYS):
                names.add(submission_lock_name(self.group, scope, identity, "key", key))
        return sorted(names)

    # -- the bodies ----------------------------------------------------------------------------

    def _guarded_view(self, *, asynchronous: bool = False) -> Callable[..., Any]:
        options = {
            "key": self.identity, "group": self.group, "wait": self.wait, "timeout": self.timeout,
            "hold": self.hold, "idempotency_header": "Idempotency-Key" if self.idempotency
            else None,
        }  # fmt: skip
        if asynchronous:

            async def async_order(request: HttpRequest) -> HttpResponse:
                holds, client = self._begin(request.headers["X-Client"])
                try:
                    await async_work(self.sim, holds[1], holds[0], self.role)
                finally:
                    stop_acting(self.sim, holds[0])
                return self._response(request, client)

            return prevent_double_submit(**options)(async_order)

        def order(request: HttpRequest) -> HttpResponse:
            holds, client = self._begin(request.headers["X-Client"])
            try:
                work(self.sim, holds[1], holds[0], self.role)
            finally:
                stop_acting(self.sim, holds[0])
            return self._response(request, client)

        return prevent_double_submit(**options)(order)

    def _begin(self, client: str) -> tuple[tuple[list[Any], Any], str]:
        """The body starts: it holds the lock its guard took (told to the ledger)."""
        lock = _acquired.pop(_holder())()
        self.processes[client].acquiring = 0  # (it holds: no longer asks)
        started, losses = self.sim.now_us, self.sim.ledger.losses
        role = replace(self.role, names=(lock.name,))
        holds = held(self.sim, client, lock, role, True, started, losses)
        assert holds is not None
        return (holds, lock), client

    def _response(self, request: HttpRequest, client: str) -> HttpResponse:
        person, item = request.headers["X-Person"], request.POST["item"]
        status = 500 if self.failing and self.sim.choices.chance(50) else 200
        content = f"{person}|{item}|{client}".encode()
        if status < 500:
            self.given.add(content)
        return HttpResponse(content, status=status)

    def _job_body(self, job: str, client: str) -> str:
        holds, _ = self._begin(client)
        try:
            work(self.sim, holds[1], holds[0], self.role)
        finally:
            stop_acting(self.sim, holds[0])
        return self._job_done(job, client)

    async def _async_job_body(self, job: str, client: str) -> str:
        holds, _ = self._begin(client)
        try:
            await async_work(self.sim, holds[1], holds[0], self.role)
        finally:
            stop_acting(self.sim, holds[0])
        return self._job_done(job, client)

    def _job_done(self, job: str, client: str) -> str:
        if self.failing and self.sim.choices.chance(50):
            raise _JobFailed(job)
        self.finished.add(job)
        return client

    # -- what each client was answered ------------------------------------------------------------

    def answered(self, client: str, request: HttpRequest, response: HttpResponse) -> None:
        sim = self.sim
        person, item = request.headers["X-Person"], request.POST["item"]
        sim.trace.add(sim.now_us, client, f"answered {response.status_code}: {response.content!r}")
        if response.headers.get("Idempotent-Replayed") == "true":
            if not self.personal:
                sim.ledger.fail(f"{client} ({person}) was replayed a response for a shared "
                                f"identity: {response.content!r}")  # fmt: skip
            if response.content not in self.given:
                sim.ledger.fail(f"{client} was replayed {response.content!r}, which no body gave")
            who, what, _ = response.content.decode().split("|")
            if (who, what) != (person, item):
                sim.ledger.fail(f"{client} ({person}, {item}) was replayed the response to "
                                f"{who}'s order of a {what}: {response.content!r}")  # fmt: skip
        elif response.status_code == 503 and sim.ledger.faults == 0:
            sim.ledger.fail(f"{client} was answered 503 with no fault")

    def ran(self, client: str, job: str, outcome: str | None) -> None:
        sim = self.sim
        sim.trace.add(sim.now_us, client, f"{job}: {'done already' if outcome is None else 'ran'}")
        if outcome is None and job not in self.finished:
            sim.ledger.fail(f"{client} was told {job} was done, and no run of it finished")

    def failed(self, client: str, error: BaseException) -> None:
        sim = self.sim
        sim.trace.add(sim.now_us, client, f"failed: {error!r}")
        if sim.ledger.faults == 0 and isinstance(error, LockBackendError):
            sim.ledger.fail(f"{client} could not reach Redis with no fault: {error!r}")


class _JobFailed(Exception):
    """A job's body that failed (nothing is marked done: the next delivery runs it)."""


def cast_guards(sim: Any, choices: Choices, *, asynchronous: bool = True) -> None:
    """Two to four clients, each a process: a sync thread, or an event loop's task (unless
    ``asynchronous`` is False: a quorum's async client runs its requests in worker threads,
    outside the simulation's)."""
    guards = _Guards(sim, choices)
    for index in range(choices.number(2, 4)):
        client = f"c{index + 1}"
        process = sim.process()
        guards.processes[client] = process
        arrival = choices.pick(ARRIVALS_MS)
        plan_crash(sim, process, choices, arrival)
        in_loop = asynchronous and choices.chance(40)
        if choices.chance(60):
            # Mostly the same order again (a double click, a retry), or another person's
            # (of the same office, when the identity is shared), or another order.
            person = choices.pick((PEOPLE[0], PEOPLE[0], *PEOPLE))
            item = choices.pick((ITEMS[0], *ITEMS))
            key = choices.pick(IDEMPOTENCY_KEYS) if guards.idempotency else None
            request = guards.request(person, item, key)
            request.META["HTTP_X_CLIENT"] = client
            view = guards.async_view if in_loop else guards.view
            call = functools.partial(view, request)
            report = functools.partial(guards.answered, client, request)
        else:
            job = choices.pick((JOBS[0], *JOBS))
            call = functools.partial(guards.async_job if in_loop else guards.job, job, client)
            report = functools.partial(guards.ran, client, job)
        if in_loop:
            program = functools.partial(_task, guards, process, client, arrival, call, report)
            sim.add_client(client, process, async_process(sim, [(client, program)]), 0)
        else:
            program = functools.partial(_thread, guards, process, client, call, report)
            sim.add_client(client, process, program, arrival)


def _thread(guards: _Guards, process: Any, client: str, call: Any, report: Any) -> None:
    """A sync client: it calls the guarded view or job, and is answered."""
    process.acquiring += 1
    try:
        outcome = call()
    except (Interrupted, LockError, _JobFailed) as error:
        guards.failed(client, error)
        return
    finally:
        process.acquiring = 0
    report(outcome)


async def _task(
    guards: _Guards, process: Any, client: str, arrival_ms: int, call: Any, report: Any
) -> None:
    """An async client, a task of its process's event loop (which runs from the start)."""
    await asyncio.sleep(arrival_ms / 1000)
    process.acquiring += 1
    try:
        outcome = await call()
    except (LockError, _JobFailed) as error:
        guards.failed(client, error)
        return
    finally:
        process.acquiring = 0
    report(outcome)
