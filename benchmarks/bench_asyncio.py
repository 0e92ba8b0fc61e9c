"""asyncio at scale: many tasks of one event loop contending for one lock, and for 50 locks, on
one private redis-server; ours beside redis-py's asyncio ``Lock`` and redis-fifo-lock.

    .venv/bin/python -m benchmarks.bench_asyncio [--tasks 200] [--seconds 8] [--output PATH]

Every pool has room for 1,000 connections: redis-py 8's default of 100 is too few for 200
tasks of redis-py's own ``Lock`` (``MaxConnectionsError``: the last table tries each lock with
the cache's default pool). Each task, until the time is up: acquire (waiting up to 60 s),
yield to the loop once while holding, release. Per row: acquisitions per second (all tasks
together), Jain's fairness index over the tasks' counts (1.0: every task got the same share),
the wait's median and p99, the client's CPU per acquisition (this process: its one event loop,
and the threads the library runs, such as lease renewal), the server's, round trips per
acquisition (counted at the client), the connections the server accepted, and overlaps (an
in-loop check: never two holders of one lock). Written to ``benchmarks/results-asyncio.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.lock

from benchmarks.harness.machine import describe_machine, log
from benchmarks.harness.markdown import fmt, heading, md_table, na_row
from benchmarks.harness.records import RequestCounter, jain, percentile, server_cpu
from benchmarks.harness.servers import private_redis

HERE = Path(__file__).resolve().parent
LEASE = 10.0
WAIT = 60.0
POOL = 1000  # connections a pool may open (redis-py 8's default: 100)

#: A row: how one library takes and gives back one lock, as an async context manager factory.
Take = Callable[[str], Any]


@dataclass
class Rival:
    title: str
    # Made inside the running loop (clients belong to their loop), from the URL and whether
    # the pool is redis-py's default: a name -> async context manager that holds that lock.
    make: Callable[[str, bool], Take]
    available: Callable[[], str | None] = lambda: None  # None, or why it cannot run here


def configure(url: str) -> None:
    """Django's caches: ``default`` with a pool of ``POOL`` connections (our asyncio client
    takes the cache's pool size), ``small`` with redis-py's default. ``small`` is on another
    database of the server: django-redis keeps one pool per URL, whatever the options."""
    import django
    from django.conf import settings

    def cache(location: str, **pool: Any) -> dict[str, Any]:
        options = {"CONNECTION_POOL_KWARGS": pool} if pool else {}
        return {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": location,
            "OPTIONS": options,
        }

    settings.configure(
        INSTALLED_APPS=["django_redis_lock"],
        CACHES={"default": cache(url, max_connections=POOL), "small": cache(small_url(url))},
        USE_TZ=True,
    )
    django.setup()


def small_url(url: str) -> str:
    return url.rsplit("/", 1)[0] + "/1"


def ours(**options: Any) -> Callable[[str, bool], Take]:
    def make(url: str, small: bool) -> Take:
        from django_redis_lock import Lock

        using = "small" if small else "default"
        return lambda name: Lock(name, wait=WAIT, using=using, **options)

    return make


def client(url: str, small: bool) -> redis.asyncio.Redis:
    if small:
        return redis.asyncio.Redis.from_url(small_url(url))
    return redis.asyncio.Redis.from_url(url, max_connections=POOL)


def redis_py(sleep: float) -> Callable[[str, bool], Take]:
    def make(url: str, small: bool) -> Take:
        pool = client(url, small)
        return lambda name: redis.asyncio.lock.Lock(
            pool, name, timeout=LEASE, sleep=sleep, blocking_timeout=WAIT
        )

    return make


def redis_fifo_lock(url: str, small: bool) -> Take:
    from redis_fifo_lock import FifoLock  # type: ignore[import-untyped]

    pool = client(url, small)
    locks: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def held(name: str) -> AsyncIterator[None]:
        lock = locks.setdefault(name, FifoLock(pool, name, lease_ms=round(LEASE * 1000)))
        lease = await lock.acquire(timeout=WAIT)
        try:
            yield
        finally:
            await lock.release(lease)

    return held


def fifo_available() -> str | None:
    try:
        import redis_fifo_lock  # type: ignore[import-untyped]  # noqa: F401
    except ImportError as error:
        return str(error)
    return None


RIVALS = [
    Rival("ours: `Lock(name)` (FIFO)", ours()),
    Rival("ours: `Lock(name, fair=False)`", ours(fair=False)),
    Rival("redis-py asyncio `Lock` (sleep=0.1, its default)", redis_py(0.1)),
    Rival("redis-py asyncio `Lock` (sleep=0.005)", redis_py(0.005)),
    Rival("redis-fifo-lock `FifoLock`", redis_fifo_lock, fifo_available),
]


@dataclass
class Outcome:
    acquisitions: int
    seconds: float
    counts: list[int]
    waits: list[float]
    client_cpu: float
    server_cpu: float
    connections: int
    overlaps: int
    requests: int = 0  # round trips (a pipeline: one), counted at the client


async def contend(take: Take, names: list[str], tasks: int, seconds: float) -> Outcome:
    """``tasks`` tasks, task ``i`` on the lock ``names[i % len(names)]``, for ``seconds``."""
    inside = dict.fromkeys(names, 0)
    counts = [0] * tasks
    waits: list[float] = []
    overlaps = 0
    start = asyncio.Event()
    deadline = 0.0

    async def worker(index: int) -> None:
        nonlocal overlaps
        name = names[index % len(names)]
        await start.wait()
        while time.monotonic() < deadline:
            asked = time.monotonic()
            async with take(name):
                waits.append(time.monotonic() - asked)
                inside[name] += 1
                overlaps += inside[name] > 1
                await asyncio.sleep(0)  # the critical section: one turn of the loop
                inside[name] -= 1
                counts[index] += 1

    running = [asyncio.create_task(worker(index)) for index in range(tasks)]
    await asyncio.sleep(0.1)  # every task waiting for the start
    cpu = time.process_time()
    began = time.monotonic()
    deadline = began + seconds
    start.set()
    await asyncio.gather(*running)
    ended = time.monotonic()
    return Outcome(
        sum(counts), ended - began, counts, waits, time.process_time() - cpu, 0.0, 0, overlaps
    )


def measure(
    rival: Rival, url: str, names: list[str], tasks: int, seconds: float, small: bool = False
) -> Outcome:
    admin = redis.Redis.from_url(url)
    admin.flushall()
    admin.config_resetstat()
    server_before = server_cpu(admin)

    async def run() -> Outcome:
        # (Our asyncio clients close with the loop: asyncio.run shuts its generators down.)
        return await contend(rival.make(url, small), names, tasks, seconds)

    counter = RequestCounter().install()
    try:
        outcome = asyncio.run(run())
    finally:
        counter.uninstall()
    outcome.requests = counter.counts["lock"]
    outcome.server_cpu = server_cpu(admin) - server_before
    outcome.connections = int(admin.info("stats")["total_connections_received"])
    return outcome


def row(title: str, outcome: Outcome) -> list[str]:
    acquisitions = max(outcome.acquisitions, 1)
    waits_ms = [wait * 1000 for wait in outcome.waits] or [0.0]
    return [
        title,
        fmt(outcome.acquisitions / outcome.seconds),
        f"{jain(outcome.counts):.3f}",
        fmt(statistics.median(waits_ms), 2),
        fmt(percentile(waits_ms, 0.99), 2),
        fmt(outcome.client_cpu / acquisitions * 1e6),
        fmt(outcome.server_cpu / acquisitions * 1e6),
        fmt(outcome.requests / acquisitions, 2),
        str(outcome.connections),
        str(outcome.overlaps),
    ]


def default_pool_rows(url: str, tasks: int) -> list[list[str]]:
    """Whether each lock copes with ``tasks`` tasks on a pool of redis-py 8's default size."""
    rows = []
    for rival in RIVALS:
        if rival.available() is not None:
            continue
        log(f"asyncio, the default pool: {rival.title}")
        try:
            outcome = measure(rival, url, ["async-small"], tasks, 2.0, small=True)
        except Exception as error:  # what a user would see
            rows.append([rival.title, f"fails: {type(error).__name__}: {error}"])
        else:
            rows.append(
                [rival.title, f"works: {fmt(outcome.acquisitions / outcome.seconds)} acq/s"]
            )
    return rows


HEADER = [
    "lock", "acq/s", "Jain", "wait p50 ms", "wait p99 ms", "client CPU µs/acq",
    "server CPU µs/acq", "round trips/acq", "connections made", "overlaps",
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--locks", type=int, default=50, help="the second table's locks")
    parser.add_argument("--output", type=Path, default=HERE / "results-asyncio.md")
    options = parser.parse_args(argv)
    started = time.monotonic()
    with private_redis() as url:
        configure(url)
        machine = describe_machine(redis.Redis.from_url(url))
        sections = []
        for title, names in (
            ("one lock", ["async-one"]),
            (f"{options.locks} locks", [f"async-{n}" for n in range(options.locks)]),
        ):
            rows = []
            for rival in RIVALS:
                reason = rival.available()
                if reason is not None:
                    rows.append(na_row(rival.title, reason, len(HEADER)))
                    continue
                log(f"asyncio, {title}: {rival.title}")
                outcome = measure(rival, url, names, options.tasks, options.seconds)
                rows.append(row(rival.title, outcome))
            sections += [
                f"## {options.tasks} tasks of one event loop, {title}",
                "",
                *md_table(HEADER, rows),
                "",
            ]
        sections += [
            f"## {options.tasks} tasks, one lock, redis-py's default pool (100 connections)",
            "",
            *md_table(["lock", "outcome"], default_pool_rows(url, options.tasks)),
            "",
        ]
    lines = heading(": asyncio at scale", "bench_asyncio.py", time.monotonic() - started, machine)
    lines += ["", *sections]
    text = "\n".join(lines)
    options.output.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
