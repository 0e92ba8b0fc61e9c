"""Task guards: what a guarded ``delay()`` costs, and whether a duplicate runs when a worker
dies or the broker delivers a message twice; ours (``GuardedTask``), celery-once's
``QueueOnce`` and celery-singleton's ``Singleton`` side by side, in one run.

    .venv/bin/python -m benchmarks.bench_tasks [--calls N] [--repetitions N] [--others N]

1. ``delay()`` with no worker running, each call a new key (so each one is published), then
   again with a key already queued (a duplicate): Redis round trips per call (counted on every
   redis-py connection of the process: the broker's and the locks') and the time per call.
   Target: a guarded ``delay()`` costs at most one round trip more than a plain one.
2. With a real prefork worker (two processes; Redis as broker and result backend):
   - *kill*: a run is SIGKILLed mid-run; the same call is made again until one is accepted, and
     it runs; how long after the kill that took, whether runs of the key overlapped;
   - *redelivery*: a task acknowledged late runs longer than the broker's
     ``visibility_timeout`` (1 s), so the broker delivers it again (same task id) while it runs;
     whether the copy ran (a duplicate run), and beside the original (an overlap).
   Target for ours: 0 overlaps and 0 duplicate runs in ``--repetitions`` (20) of each.

Written to ``benchmarks/results-tasks.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.harness.machine import ROOT
from benchmarks.harness.servers import EmbeddedRedis

HERE = Path(__file__).resolve().parent

LIBRARIES = {
    "ours": "django-redis-lock GuardedTask",
    "celery_once": "celery-once QueueOnce",
    "celery_singleton": "celery-singleton Singleton",
}


# -- counting round trips ----------------------------------------------------------------------


class RoundTrips:
    """Counts what every redis-py connection of this process sends: one count per send (a
    pipeline is one)."""

    def __init__(self) -> None:
        self.count = 0

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        from redis.connection import AbstractConnection

        original = AbstractConnection.send_packed_command

        def counted(connection: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(connection, command, *args, **kwargs)

        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
        try:
            yield
        finally:
            AbstractConnection.send_packed_command = original  # type: ignore[method-assign]


@dataclass
class Cost:
    round_trips: float
    median_us: float
    p99_us: float


def call_costs(
    calls: dict[str, Callable[[int], Any]], count: int, block: int = 100
) -> dict[str, Cost]:
    """Each of ``calls`` (``call(i)``) ``count`` times, after a warm-up, in round-robin blocks
    of ``block`` calls, so that a machine busier at one moment than another slows all alike."""
    for call in calls.values():
        for index in range(50):
            call(-index - 1)
    trips = {name: RoundTrips() for name in calls}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for start in range(0, count, block):
        for name, call in calls.items():
            with trips[name].counting():
                for index in range(start, min(start + block, count)):
                    began = time.perf_counter()
                    call(index)
                    samples[name].append((time.perf_counter() - began) * 1e6)
    costs = {}
    for name, taken in samples.items():
        taken.sort()
        costs[name] = Cost(
            trips[name].count / count, statistics.median(taken), taken[int(count * 0.99) - 1]
        )
    return costs


# -- scenarios with a worker -------------------------------------------------------------------


@dataclass
class Scenario:
    repetitions: int = 0
    overlaps: int = 0
    duplicate_runs: int = 0
    recovered: list[float] = field(default_factory=list)  # kill: seconds to the next run
    stuck: int = 0  # kill: no call accepted within the bound


def accepted(result: Any, first: str | None) -> str | None:
    """The id of a call that was queued (not a duplicate answered with the first one's id,
    celery-once's rejection or None)."""
    task_id = getattr(result, "id", None)
    return task_id if task_id is not None and task_id != first else None


def starts(client: Any, key: str) -> list[dict[str, Any]]:
    records = [json.loads(item) for item in client.lrange(f"events:{key}", 0, -1)]
    return [record for record in records if record["event"] == "start"]


def wait_for(predicate: Callable[[], Any], timeout: float) -> Any:
    """``predicate()``'s first true value within ``timeout`` seconds, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    return None


def kill_once(task: Any, client: Any, result: Scenario, bound: float) -> None:
    key = f"kill-{uuid.uuid4().hex[:10]}"
    first = task.delay(key, 60).id
    run = wait_for(lambda: starts(client, key), 30)
    if not run:
        raise RuntimeError(f"{task.name} did not start within 30 s")
    os.kill(run[0]["pid"], signal.SIGKILL)
    killed = time.time()
    second = wait_for(lambda: accepted(task.delay(key, 0), first), bound)
    result.repetitions += 1
    if second is None:
        result.stuck += 1
    else:
        started = wait_for(lambda: [s for s in starts(client, key) if s["id"] == second], 30)
        if started:
            result.recovered.append(started[0]["at"] - killed)
    _count(client, key, result)


def redeliver_once(task: Any, client: Any, result: Scenario) -> None:
    key = f"redelivery-{uuid.uuid4().hex[:10]}"
    task.delay(key, 3)
    end = wait_for(lambda: client.llen(f"events:{key}") >= 2 and not client.scard(f"inside:{key}"),
                   30)  # fmt: skip
    if not end:
        raise RuntimeError(f"{task.name}: the run did not end within 30 s")
    # A copy delivered again may still be deciding whether to run (ours waits a lease and a
    # second for the original): give it that long before counting what ran.
    time.sleep(3.0)
    result.repetitions += 1
    _count(client, key, result)


def _count(client: Any, key: str, result: Scenario) -> None:
    result.overlaps += int(client.get(f"overlaps:{key}") or 0)
    ids = [start["id"] for start in starts(client, key)]
    result.duplicate_runs += len(ids) - len(set(ids))


def scenarios(
    broker_url: str, redis_url: str, repetitions: dict[str, int], bound: float, log_dir: Path
) -> dict[str, dict[str, Scenario | str]]:
    import redis

    from benchmarks import bench_tasks_app as bench_app
    from tests.support.task_workers import WorkerProcess

    client = redis.Redis.from_url(redis_url)
    outcome: dict[str, dict[str, Scenario | str]] = {}
    for kind in ("kill", "redelivery"):
        env = {"BENCH_BROKER_URL": broker_url, "BENCH_REDIS_URL": redis_url,
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        if kind == "redelivery":
            env["BENCH_VISIBILITY"] = "1"
        command = [
            sys.executable, "-m", "celery", "-A", bench_app.__name__, "worker", "--pool",
            "prefork", "--concurrency", "2", "--loglevel", "INFO", "--without-gossip",
            "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        worker = WorkerProcess(command, env, log_dir / f"{kind}.log", ready=" ready.")
        worker.start()
        try:
            for library, count in repetitions.items():
                name = library if kind == "kill" else f"{library}_acks_late"
                task = bench_app.task_named(name)
                row = outcome.setdefault(library, {})
                if task is None:
                    row[kind] = "not installed"
                    continue
                result = Scenario()
                for _ in range(count):
                    if kind == "kill":
                        kill_once(task, client, result, bound)
                    else:
                        redeliver_once(task, client, result)
                row[kind] = result
                print(f"  {kind} {library}: {result}", flush=True)
        finally:
            worker.stop()
    return outcome


# -- the report --------------------------------------------------------------------------------


def costs(count: int) -> dict[str, tuple[Cost, Cost | None] | str]:
    from benchmarks import bench_tasks_app as bench_app

    rows: dict[str, tuple[Cost, Cost | None] | str] = {}
    fresh: dict[str, Callable[[int], Any]] = {}
    duplicates: dict[str, Callable[[int], Any]] = {}
    run_id = uuid.uuid4().hex[:8]
    for name in ("plain", *LIBRARIES):
        task = bench_app.task_named(name)
        if task is None:
            rows[name] = "not installed"
            continue
        fresh[name] = lambda i, t=task, n=name: t.delay(f"cost-{run_id}-{n}-{i}")
        if name != "plain":
            task.delay(f"dup-{run_id}-{name}")
            duplicates[name] = lambda i, t=task, n=name: t.delay(f"dup-{run_id}-{n}")
    new, again = call_costs(fresh, count), call_costs(duplicates, count)
    for name, cost in new.items():
        rows[name] = (cost, again.get(name))
        print(f"  delay() {name}: {cost} / duplicate {again.get(name)}", flush=True)
    return rows


def render(
    cost_rows: dict[str, tuple[Cost, Cost | None] | str],
    outcome: dict[str, dict[str, Scenario | str]],
    calls: int,
    bound: float,
    rtt: float,
    seconds: float,
) -> str:
    from importlib.metadata import PackageNotFoundError, version

    def version_of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    lines = [
        "# Task guards: cost of a guarded delay(), and duplicates after failures",
        "",
        f"Written by `benchmarks/bench_tasks.py` (`make bench`) on "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC in {seconds:.0f} s; Python "
        f"{platform.python_version()}, Celery {version_of('celery')}, celery-once "
        f"{version_of('celery-once')}, celery-singleton {version_of('celery-singleton')}; "
        "private redis-servers on loopback (broker and result backend on one, locks on "
        f"another). Median PING round trip: {rtt:.1f} µs.",
        "",
        f"## delay(): {calls} calls each",
        "",
        "Taken in round-robin blocks of 100 calls per task, after 50 warm-up calls each; no",
        "worker runs meanwhile. Round trips are counted on every redis-py connection of the",
        "process.",
        "",
        "| task | round trips | median µs | p99 µs | duplicate: round trips | median µs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    plain = cost_rows.get("plain")
    for name, row in cost_rows.items():
        title = "plain Celery task" if name == "plain" else LIBRARIES[name]
        if isinstance(row, str):
            lines.append(f"| {title} | {row} | | | | |")
            continue
        fresh, duplicate = row
        dup = (f"{duplicate.round_trips:.2f} | {duplicate.median_us:.0f}" if duplicate
               else "- | -")  # fmt: skip
        lines.append(
            f"| {title} | {fresh.round_trips:.2f} | {fresh.median_us:.0f} | "
            f"{fresh.p99_us:.0f} | {dup} |"
        )
    ours = cost_rows.get("ours")
    if not isinstance(plain, str) and plain and not isinstance(ours, str) and ours:
        extra = ours[0].round_trips - plain[0].round_trips
        lines += [
            "",
            f"- a guarded delay() makes **{extra:.2f}** round trips more than a plain one "
            f"(target: at most 1): {'met' if extra <= 1.0 + 1e-9 else 'missed'}; it takes "
            f"{ours[0].median_us - plain[0].median_us:.0f} µs more (median).",
        ]
    lines += [
        "",
        "## Failures, with a real worker",
        "",
        f"*kill*: a run SIGKILLed, the same call made again until one is queued (for at most "
        f"{bound:.0f} s). *redelivery*: a message delivered again (same task id) while it runs.",
        "",
        "| library | kill: repetitions | overlaps | next run after the kill, median s | no "
        f"run within {bound:.0f} s | redelivery: repetitions | duplicate runs | overlaps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for library, title in LIBRARIES.items():
        row = outcome.get(library, {})
        kill, again = row.get("kill"), row.get("redelivery")
        if isinstance(kill, str) or kill is None or isinstance(again, str) or again is None:
            lines.append(f"| {title} | {kill or again or 'n/a'} | | | | | | |")
            continue
        recovered = f"{statistics.median(kill.recovered):.2f}" if kill.recovered else "-"
        lines.append(
            f"| {title} | {kill.repetitions} | {kill.overlaps} | {recovered} | {kill.stuck} | "
            f"{again.repetitions} | {again.duplicate_runs} | {again.overlaps} |"
        )
    mine = outcome.get("ours", {})
    kill, again = mine.get("kill"), mine.get("redelivery")
    if isinstance(kill, Scenario) and isinstance(again, Scenario):
        bad = kill.overlaps + again.overlaps + again.duplicate_runs + kill.stuck
        lines += [
            "",
            f"- ours: {bad} overlaps, duplicate runs or stuck keys in {kill.repetitions} kills "
            f"and {again.repetitions} redeliveries (target: 0): {'met' if bad == 0 else 'missed'}",
        ]
    lines += [
        "",
        "Ours frees a killed run's key when the worker's main process sees the run die, or",
        "when its lease (2 s here, renewed while it runs) ends, whichever is first; the others",
        "keep it for their own timeout (celery-once: an hour; celery-singleton: until deleted),",
        "since a killed run never reaches the code that deletes it. A copy delivered again",
        "runs in the others (they look only when a call is queued); ours finds the original's",
        "lease, waits it out and, the original alive, acknowledges the copy without running it.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repetitions", type=int, default=20, help="of each failure, ours")
    parser.add_argument("--others", type=int, default=3, help="of each failure, the others")
    parser.add_argument("--bound", type=float, default=10.0, help="kill: seconds to wait")
    parser.add_argument("--output", type=Path, default=HERE / "results-tasks.md")
    options = parser.parse_args(argv)
    started = time.monotonic()

    with (
        EmbeddedRedis() as broker,
        EmbeddedRedis() as locks,
        tempfile.TemporaryDirectory() as logs,
    ):
        os.environ["BENCH_BROKER_URL"] = broker.url
        os.environ["BENCH_REDIS_URL"] = locks.url
        import redis

        from django_redis_lock.backends.wire import execute

        client = redis.Redis.from_url(locks.url)
        pings = []
        for _ in range(1000):
            begun = time.perf_counter()
            execute(client, "PING")
            pings.append((time.perf_counter() - begun) * 1e6)
        rtt = statistics.median(pings)
        print("delay() costs", flush=True)
        cost_rows = costs(options.calls)
        redis.Redis.from_url(broker.url).flushall()
        client.flushall()
        print("failures, with a worker", flush=True)
        repetitions = {"ours": options.repetitions, "celery_once": options.others,
                       "celery_singleton": options.others}  # fmt: skip
        outcome = {}
        if options.repetitions or options.others:
            outcome = scenarios(broker.url, locks.url, repetitions, options.bound, Path(logs))
    text = render(cost_rows, outcome, options.calls, options.bound, rtt,
                  time.monotonic() - started)  # fmt: skip
    options.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
