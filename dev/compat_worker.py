"""One process of ``make compat`` (dev/compat.py): the library of one side, old or new, taking
the shared locks beside the other side's processes, and leaving what it saw in Redis.

Run by path, never as ``dev.compat_worker``: ``sys.path`` then holds this folder, the side's
tree (``PYTHONPATH``) and the venv, so ``import django_redis_lock`` is the side's own. It uses
only the public API (what a project's code calls), as both sides spell it.

Its evidence goes under ``compat-evidence:`` (keys the library never uses), read by the driver:

    <scenario>:inside:<name>   holders inside a critical section now (INCR on entry, DECR on exit)
    <scenario>:most:<name>     the most ever inside at once
    <scenario>:count           read-modify-writes done under the lock (a lost one: overlap)
    <scenario>:order           the side of each holder in turn (handoffs between the sides)
    <scenario>:runs:<round>    how many times a guarded body ran for one round
    <scenario>:waits           each acquisition's wait, ms (a stalled handoff shows here)
    <scenario>:handoffs        ``<from>><to> <ms>``: the lock's way from a release to a waiter
    <scenario>:problems        what a worker saw go wrong, as text
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis

EVIDENCE = "compat-evidence:"


def evidence_key(scenario: str, *parts: object) -> str:
    """Where a scenario's evidence is (the module docstring's list): the workers write it, the
    driver (dev/compat.py) reads it."""
    return EVIDENCE + ":".join([scenario, *map(str, parts)])


BARRIER_WAIT = 120.0  # s: the slowest worker's start (Django's, the side's imports) and scenario


def setup_django(redis_url: str, key_prefix: str | None) -> None:
    """The smallest project both sides accept: django-redis as the default cache, our app."""
    import django
    from django.conf import settings

    options: dict[str, Any] = {
        "INSTALLED_APPS": [
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django_redis_lock",
        ],
        "CACHES": {
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": redis_url,
                "OPTIONS": {"SOCKET_TIMEOUT": 10, "SOCKET_CONNECT_TIMEOUT": 5},
            }
        },
        "DATABASES": {},
        "USE_TZ": True,
        "SECRET_KEY": "compat",
        "ROOT_URLCONF": __name__,
    }
    if key_prefix is not None:
        options["DJANGO_REDIS_LOCK_KEY_PREFIX"] = key_prefix
    settings.configure(**options)
    django.setup()
    # What the guards say of each duplicate they turn away is the point here, not news.
    logging.getLogger("django_redis_lock").setLevel(logging.ERROR)


urlpatterns: list[Any] = []  # ROOT_URLCONF: the guards reverse nothing, but Django asks


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.side: str = args.side
        self.index: int = args.index
        self.total: int = args.total
        self.rounds: int = args.rounds
        self.evidence = redis.Redis.from_url(args.url)
        self.random = random.Random(f"{self.side}-{self.index}")

    @property
    def me(self) -> str:
        return f"{self.side}-{self.index}"

    def key(self, scenario: str, *parts: object) -> str:
        return evidence_key(scenario, *parts)

    def problem(self, scenario: str, text: str) -> None:
        self.evidence.rpush(self.key(scenario, "problems"), f"{self.me}: {text}")

    def barrier(self, name: str) -> None:
        """Every worker of both sides here before any goes on (each scenario starts at once)."""
        key = self.key("barrier", name)
        self.evidence.incr(key)
        deadline = time.monotonic() + BARRIER_WAIT
        while int(self.evidence.get(key) or 0) < self.total:
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.me}: the others never reached {name!r}")
            time.sleep(0.005)

    @contextlib.contextmanager
    def inside(self, scenario: str, name: object) -> Iterator[None]:
        """A critical section: how many are inside ``name`` at once, recorded."""
        count = self.evidence.incr(self.key(scenario, "inside", name))
        most = self.key(scenario, "most", name)
        self.evidence.eval(
            "if tonumber(redis.call('GET', KEYS[1]) or 0) < tonumber(ARGV[1]) then "
            "redis.call('SET', KEYS[1], ARGV[1]) end",
            1,
            most,
            count,
        )
        try:
            yield
        finally:
            self.evidence.decr(self.key(scenario, "inside", name))

    def update(self, scenario: str) -> None:
        """A read-modify-write that only mutual exclusion keeps whole (a lost update: overlap)."""
        key = self.key(scenario, "count")
        value = int(self.evidence.get(key) or 0)
        time.sleep(0.0005)
        self.evidence.set(key, value + 1)
        self.evidence.rpush(self.key(scenario, "order"), self.side)

    def timed(self, scenario: str, acquire: Callable[[], bool]) -> bool:
        started = time.monotonic()
        acquired = acquire()
        waited = round((time.monotonic() - started) * 1000, 2)
        self.evidence.rpush(self.key(scenario, "waits"), waited)
        if not acquired:
            self.problem(scenario, f"not acquired after {waited} ms")
        return acquired

    # -- the scenarios, in the order they run ---------------------------------------------------

    def lock(self, scenario: str, *, fair: bool) -> None:
        from django_redis_lock import Lock

        fence = self.key(scenario, "fence")
        released = self.key(scenario, "released")
        for round_ in range(self.rounds):
            # Every round, every process of both sides in the line at once: the lock passes
            # from one side to the other in each round.
            self.barrier(f"{scenario}-{round_}")
            held = Lock(f"compat-{scenario}", fair=fair, fencing=True, timeout=10, wait=60)
            started = time.monotonic()
            if not self.timed(scenario, held.acquire):
                continue
            try:
                with self.inside(scenario, "lock"):
                    self.handoff(scenario, started, self.evidence.get(released))
                    token = held.fencing_token
                    last = int(self.evidence.get(fence) or 0)
                    if token is None or token <= last:
                        self.problem(scenario, f"fencing token {token} after {last}")
                    else:
                        self.evidence.set(fence, token)
                    self.update(scenario)
                    self.evidence.set(released, f"{self.side} {time.monotonic()}")
            finally:
                held.release()

    def handoff(self, scenario: str, started: float, released: Any) -> None:
        """A holder that was in line when the one before it let go records how long the lock
        took to reach it (the system's monotonic clock, which every process here reads): a
        wake-up the other side's release never sent shows as a waiter that found out only on
        its own, up to 2 s later (its longest block before asking again)."""
        if released is None:
            return
        side, _, at = released.decode().partition(" ")
        if started < float(at):
            gap = round((time.monotonic() - float(at)) * 1000, 2)
            self.evidence.rpush(self.key(scenario, "handoffs"), f"{side}>{self.side} {gap}")

    def fifo(self) -> None:
        self.lock("fifo", fair=True)

    def unfair(self) -> None:
        self.lock("unfair", fair=False)

    def semaphore(self) -> None:
        from django_redis_lock import Semaphore

        for _ in range(self.rounds):
            permit = Semaphore("compat-semaphore", 2, timeout=10, wait=60)
            if not self.timed("semaphore", permit.acquire):
                continue
            try:
                with self.inside("semaphore", "permits"):
                    time.sleep(0.001)
            finally:
                permit.release()

    def many(self) -> None:
        """``lock_many`` over two of three names, and single ``Lock``s of them in between."""
        from django_redis_lock import Lock, lock_many

        names = ["a", "b", "c"]
        for round_ in range(self.rounds):
            chosen = sorted(self.random.sample(names, 1 if round_ % 3 == 2 else 2))
            full = [f"compat-many-{name}" for name in chosen]
            held: Any = (
                Lock(full[0], timeout=10, wait=60)
                if len(full) == 1
                else lock_many(full, timeout=10, wait=60)
            )
            if not self.timed("many", held.acquire):
                continue
            try:
                with contextlib.ExitStack() as stack:
                    for name in chosen:
                        stack.enter_context(self.inside("many", name))
                    time.sleep(0.0005)
            finally:
                held.release()

    def once(self) -> None:
        """``run_once``: each round's body runs once, whichever side's process comes first."""
        from django_redis_lock import run_once

        for round_ in self.rotated():
            with run_once(f"compat-once-{round_}", ttl=300, wait=60) as first:
                if first:
                    self.evidence.incr(self.key("once", "runs", round_))
                    time.sleep(0.002)

    def stampede(self) -> None:
        """``get_or_set_locked``: one computation per key, its value read by the other side."""
        from django_redis_lock import get_or_set_locked

        for round_ in self.rotated():

            def compute(round_: int = round_) -> str:
                self.evidence.incr(self.key("stampede", "runs", round_))
                time.sleep(0.002)
                return f"computed by {self.me}"

            value = get_or_set_locked(f"compat-stampede-{round_}", compute, 300, wait=60)
            self.evidence.sadd(self.key("stampede", "values", round_), value)

    def submit(self) -> None:
        """``prevent_double_submit``: one user sends one form to every process at once: the
        view runs once, the others get its response replayed (or 409)."""
        from django.http import HttpResponse
        from django.test import RequestFactory

        from django_redis_lock import prevent_double_submit

        @prevent_double_submit(key="user", hold=60, wait=60)
        def view(request: Any) -> HttpResponse:
            round_ = request.POST["round"]
            self.evidence.incr(self.key("submit", "runs", round_))
            time.sleep(0.002)
            return HttpResponse(f"round {round_} by {self.me}")

        factory = RequestFactory()
        for round_ in self.rotated():
            request = factory.post("/compat/order/", {"round": str(round_), "item": "book"})
            request.user = CompatUser()  # type: ignore[assignment]  # what key="user" reads
            response = view(request)
            answer = f"{response.status_code} {response.content.decode()}"
            self.evidence.sadd(self.key("submit", "answers", round_), answer)

    def tasks(self) -> None:
        """Celery's ``GuardedTask``: every process is handed a copy of each round's task (one
        task id, as a broker delivering it again does): it runs once, wherever the copies land
        and whether its original is running or finished (the task's record of having run)."""
        from celery import Celery

        from django_redis_lock.celery import GuardedTask

        app = Celery("compat", set_as_current=True)

        @app.task(  # type: ignore[untyped-decorator]  # celery is untyped
            base=GuardedTask, guard_key="{number}", name="compat.sync", shared=False
        )
        def sync(number: int) -> None:
            with self.inside("tasks", number):
                self.evidence.incr(self.key("tasks", "runs", number))
                time.sleep(0.002)

        for round_ in self.rotated():
            sync.apply(args=(round_,), task_id=f"compat-task-{round_}")

    def records(self) -> None:
        """Each side reads the other's records: a held lock's and a semaphore permit's holder
        (``registry``: what the admin and ``redis_locks`` show)."""
        from django_redis_lock import Lock, Semaphore, registry

        if self.index != 0:
            self.barrier("records-held")
            self.barrier("records-read")
            return
        mine = Lock(f"compat-records-{self.side}", timeout=60, label=f"label of {self.side}")
        permit = Semaphore(f"compat-records-{self.side}", 3, timeout=60, label=f"{self.side}")
        assert mine.acquire(wait=10)
        assert permit.acquire(wait=10)
        self.evidence.hset(
            self.key("records", "holders"),
            self.side,
            json.dumps({"pid": os.getpid(), "host": socket.gethostname()}),
        )
        self.barrier("records-held")
        try:
            other = "new" if self.side == "old" else "old"
            expected = json.loads(
                self.evidence.hget(self.key("records", "holders"), other) or "{}"
            )
            seen = registry.get_lock(f"compat-records-{other}")
            if seen is None or not seen.valid:
                self.problem("records", f"the {other} side's lock not read: {seen!r}")
            else:
                read = {"label": seen.label, "pid": seen.pid, "host": seen.host}
                if read != {"label": f"label of {other}", **expected}:
                    self.problem("records", f"the {other} side's lock read as {read}")
            semaphore = registry.get_semaphore(f"compat-records-{other}")
            holders = [] if semaphore is None else list(semaphore.holders)
            found = [(holder.label, holder.pid, holder.host) for holder in holders]
            if found != [(other, expected["pid"], expected["host"])]:
                self.problem("records", f"the {other} side's permit read as {found}")
        finally:
            self.barrier("records-read")
            mine.release()
            permit.release()

    def rotated(self) -> list[int]:
        """The rounds, each worker starting at another one (so that each side comes first in
        some of them)."""
        start = self.index * 2 + (1 if self.side == "new" else 0)
        return [(start + step) % self.rounds for step in range(self.rounds)]


class CompatUser:
    """The one person sending in ``submit``: what the guard's ``key="user"`` reads."""

    pk = 1
    is_authenticated = True


SCENARIOS = [
    "fifo", "unfair", "semaphore", "many", "once", "stampede", "submit", "tasks", "records",
]  # fmt: skip


def hold(args: argparse.Namespace) -> None:
    """For the dead-holder check: hold ``args.name`` with a long lease until killed."""
    from django_redis_lock import Lock

    held = Lock(args.name, timeout=120)
    assert held.acquire(wait=10)
    print("held", flush=True)
    time.sleep(3600)


def take(args: argparse.Namespace) -> None:
    """For the dead-holder check: wait for ``args.name``; say when it is in line behind its
    holder, then when it was taken (the system's monotonic clock, which the driver's reads)."""
    from django_redis_lock import Lock, lock_contended

    def queued(**_: Any) -> None:
        print("queued", flush=True)  # in line behind the holder: the driver kills it now

    lock_contended.connect(queued, weak=False)
    taken = Lock(args.name, timeout=10, wait=100)
    acquired = taken.acquire()
    print(json.dumps({"acquired": acquired, "at": time.monotonic()}), flush=True)
    if acquired:
        taken.release()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["run", "hold", "take"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--side", choices=["old", "new"], required=True)
    parser.add_argument("--tree", required=True, help="where the side's django_redis_lock is")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--total", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--scenario", action="append", choices=SCENARIOS)
    parser.add_argument("--name", default="compat-dead")
    parser.add_argument("--key-prefix", help="DJANGO_REDIS_LOCK_KEY_PREFIX (the self-test's)")
    args = parser.parse_args()
    setup_django(args.url, args.key_prefix)

    import django_redis_lock

    where = os.path.realpath(django_redis_lock.__file__)
    if not where.startswith(os.path.join(os.path.realpath(args.tree), "django_redis_lock", "")):
        raise SystemExit(f"{args.side}: imported {where}, not the tree {args.tree}")
    if args.mode == "hold":
        hold(args)
    elif args.mode == "take":
        take(args)
    else:
        worker = Worker(args)
        for scenario in args.scenario or SCENARIOS:
            worker.barrier(scenario)
            try:
                getattr(worker, scenario)()
            except Exception as error:
                # A side that lacks what the scenario calls (a ref older than the API it
                # uses) or that fails in it: the driver reports it as the scenario's failure.
                worker.problem(scenario, f"{type(error).__name__}: {error}")
        print(json.dumps({"side": args.side, "version": django_redis_lock.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
