"""Faults that cut off queued waiters while Redis keeps its data: the lock under load.

    make bench    # or: .venv/bin/python -m benchmarks.bench_faults [--quick] [--before REF]
                  #                                        [--scenario refuse|aof|none|aof-none]

Each run: a private redis-server (``harness.servers.EmbeddedRedis``, a fresh one per run),
a proxy in front of it (``harness.fault_proxy.FaultProxy``, in this process), and 6 worker
processes that contend for one lock through the proxy for 30 s (``--quick``: 10 s). Each worker
loops::

    with Lock("bench:faults", wait=2):     # a new Lock object each time, as a view would
        INCR inside; != 1 is an overlap; sleep 0.5 ms; DECR inside

the critical section on a client of its own straight to Redis (not through the proxy, no
retries), and counts ``LockNotAcquired`` (timed-out waits) and ``LockBackendError`` (backend
errors; then it sleeps 50 ms before trying again). A critical section whose own client fails
(the server restarting) counts as an other error, and sets ``inside`` back to 0 (retried
until Redis answers) before leaving the block, since the INCR or DECR may or may not have run.

The lock's cache: ``django_redis.cache.RedisCache`` at the proxy's URL with
``OPTIONS = {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 1}``: a refused or cut connection
fails at once, a connect that hangs fails after 1 s, and a reply waits 5 s at most (more than the
lock's longest block, ``BLOCK_CAP`` = 2 s); every other setting is the library's default (the
lease: 30 s, renewed).

Scenarios (a fault every ``PERIOD`` = 5 s, from 5 s into the run):

- **refuse** (proxy refuses connections): the proxy resets every connection and stops
  listening, so new connections are refused (``ECONNREFUSED``), for 1 s, then listens again;
  Redis itself runs on untouched.
- **aof** (AOF restart): the server runs with ``--appendonly yes --appendfsync always`` and is
  restarted on the same port and directory: stopped gracefully (SIGTERM: Redis writes and
  fsyncs its AOF and exits) and started again, loading the AOF. Every lease, queue entry and
  counter survives (a canary key written before the first restart is checked after each);
  every connection is cut, and Redis is down for the restart's length (reported).
- **none** (no fault): the same run without faults, so the cost of the faults shows;
- **aof-none** (no fault, AOF on): the same, on a server with the AOF scenario's options (an
  fsync per write is slower): the baseline of the AOF restarts.

Reported per package and scenario: acquisitions (and their rate until the first fault, so
that the machine's own variation, an fsync's cost above all, can be told from the faults'),
timed-out waits, backend errors (of which failed releases: a release that raised, which leaves
its lease to run out by itself), other errors, overlaps (must be 0), and the recovery after
each fault: the longest gap between two successive acquisitions (by anybody) from the last
acquisition before the fault until the next fault (or the run's end); if no acquisition came
in that window, until the first that came after it. Its max and median over the run's faults;
the no-fault runs show the same figure at the same instants. Events after the run's end are
not counted, except overlaps.

``--before REF`` runs the package as it was at git ``REF`` too (a temporary ``git worktree``,
as ``bench_dead_waiter.py``): each worker imports the package of its tree (``sys.path``). The
trees take turns, scenario by scenario, so that each sees the same machine. Results go to
``benchmarks/results-faults.md`` (and stdout).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness.fault_proxy import FaultProxy
from benchmarks.harness.machine import ROOT, worktree_at
from benchmarks.harness.servers import EmbeddedRedis

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results-faults.md"
LOCK_NAME = "bench:faults"
INSIDE_KEY = "bench:faults:inside"
CANARY_KEY = "bench:faults:canary"
WORKERS = 6
WAIT = 2.0  # Lock(..., wait=WAIT)
CRITICAL_SECTION = 0.0005
ERROR_PAUSE = 0.05  # after a backend error, before trying again
PERIOD = 5.0  # a fault every PERIOD seconds, the first PERIOD seconds into the run
REFUSAL = 1.0  # the proxy refuses connections this long
SECONDS, QUICK_SECONDS = 30.0, 10.0
CACHE_OPTIONS = {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 1}
AOF_ARGS = ["--appendonly", "yes", "--appendfsync", "always"]
LATE_REPORT = 60.0  # a worker that has not reported this long after the run's end is killed


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    server_args: tuple[str, ...] = ()


SCENARIOS = [
    Scenario("refuse", f"proxy refuses connections ({REFUSAL:g} s)"),
    Scenario("aof", "AOF restart", tuple(AOF_ARGS)),
    Scenario("none", "no fault"),
    Scenario("aof-none", "no fault, AOF on", tuple(AOF_ARGS)),
]
SCENARIO_BY_KEY = {scenario.key: scenario for scenario in SCENARIOS}

# A worker process: the package from the tree given on its command line. It warms up (one
# acquisition), says "ready <the package's path>", reads "go <start> <end>" (monotonic seconds:
# one clock for every process of the machine), loops until the end and writes its events to
# the report file, as JSON.
WORKER = textwrap.dedent(
    """
    import json, sys, time
    root, lock_url, direct_url, report_path = sys.argv[1:5]
    wait, critical_section, pause = map(float, sys.argv[5:8])
    lock_name, inside_key, cache_options = sys.argv[8], sys.argv[9], json.loads(sys.argv[10])
    sys.path.insert(0, root)
    import django
    from django.conf import settings
    settings.configure(
        INSTALLED_APPS=["django_redis_lock"], USE_TZ=True,
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": lock_url,
                            "OPTIONS": cache_options}},
    )
    django.setup()
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    import django_redis_lock
    from django_redis_lock import Lock, LockBackendError, LockNotAcquired

    # The critical section's client: straight to Redis, no retries (an INCR retried after a
    # lost reply would count twice).
    work = redis.Redis.from_url(direct_url, socket_timeout=5, retry=Retry(NoBackoff(), 0))
    work.ping()
    with Lock(lock_name, wait=30):
        pass
    print("ready", django_redis_lock.__file__, flush=True)
    _go, start, end = sys.stdin.readline().split()
    start, end = float(start), float(end)
    time.sleep(max(0.0, start - time.monotonic()))

    events = {"acquired": [], "timeout": [], "backend": [], "release": [], "overlap": [],
              "critical": [], "other": []}
    other_kinds = {}
    unrepaired = 0

    def repair():
        # Inside the lock still: nobody else is inside, so "inside" must be 0 again.
        global unrepaired
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up:
            try:
                work.set(inside_key, 0)
                return
            except redis.RedisError:
                time.sleep(0.02)
        unrepaired += 1

    while time.monotonic() < end:
        entered = False
        try:
            with Lock(lock_name, wait=wait):
                entered = True
                now = time.monotonic()
                events["acquired"].append(now)
                try:
                    if work.incr(inside_key) != 1:
                        events["overlap"].append(now)
                    time.sleep(critical_section)
                    work.decr(inside_key)
                except redis.RedisError as exc:
                    events["critical"].append(time.monotonic())
                    kind = "critical section: " + type(exc).__name__
                    other_kinds[kind] = other_kinds.get(kind, 0) + 1
                    repair()
        except LockNotAcquired:
            events["timeout"].append(time.monotonic())
        except LockBackendError:
            events["release" if entered else "backend"].append(time.monotonic())
            time.sleep(pause)
        except Exception as exc:
            events["other"].append(time.monotonic())
            kind = type(exc).__name__ + (" on release" if entered else "")
            other_kinds[kind] = other_kinds.get(kind, 0) + 1
            time.sleep(pause)
    with open(report_path, "w") as out:
        json.dump({"events": events, "other_kinds": other_kinds, "unrepaired": unrepaired}, out)
    """
)


# -- one run ---------------------------------------------------------------------------------


@dataclass
class Run:
    """One tree in one scenario."""

    acquired: list[float] = field(default_factory=list)  # every acquisition, sorted
    timeouts: int = 0
    backend_errors: int = 0  # LockBackendError, failed releases included
    failed_releases: int = 0
    critical_errors: int = 0  # the critical section's own client failed
    other_errors: int = 0  # anything else, critical-section errors included
    other_kinds: dict[str, int] = field(default_factory=dict)
    overlaps: int = 0
    unrepaired: int = 0
    faults: list[tuple[float, float]] = field(default_factory=list)  # (began, ended)
    recoveries: list[float] = field(default_factory=list)  # seconds, one per fault
    stalled: int = 0  # faults whose window held no acquisition
    rate_before: float = 0.0  # acquisitions per second before the first fault
    canary_lost: int = 0  # AOF: restarts after which the canary key was gone
    seconds: float = 0.0
    error: str | None = None


@dataclass
class Tree:
    title: str
    root: Path
    runs: dict[str, Run] = field(default_factory=dict)


def start_worker(
    root: Path, lock_url: str, direct_url: str, report: Path
) -> subprocess.Popen[str]:
    stderr = report.with_suffix(".stderr").open("w")  # the lock's warnings can be many
    try:
        return subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), lock_url, direct_url, str(report),
             str(WAIT), str(CRITICAL_SECTION), str(ERROR_PAUSE), LOCK_NAME, INSIDE_KEY,
             json.dumps(CACHE_OPTIONS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=root,
        )  # fmt: skip
    finally:
        stderr.close()


def worker_failure(report: Path, what: str) -> RuntimeError:
    stderr = report.with_suffix(".stderr")
    tail = stderr.read_text(errors="replace").strip().splitlines()[-3:] if stderr.exists() else []
    return RuntimeError(f"{what}: {' | '.join(tail) or 'no output'}")


def recoveries(
    acquired: Sequence[float], faults: Sequence[float], end: float
) -> tuple[list[float], int]:
    """Per fault instant: the longest gap between successive acquisitions from the last one
    before it until the next fault (or ``end``); if none came in that window, until the first
    after it (or ``end``). And how many windows held no acquisition."""
    gaps, stalled = [], 0
    for index, fault in enumerate(faults):
        until = faults[index + 1] if index + 1 < len(faults) else end
        first = bisect.bisect_left(acquired, fault)
        last = bisect.bisect_left(acquired, until)
        before = acquired[first - 1] if first > 0 else fault
        points = [before, *acquired[first:last]]
        if first == last:  # nothing in the window
            stalled += 1
            points.append(acquired[last] if last < len(acquired) else end)
        gaps.append(max(b - a for a, b in itertools.pairwise(points)))
    return gaps, stalled


def run_once(tree: Tree, scenario: Scenario, seconds: float) -> Run:
    run = Run()
    with contextlib.ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-faults-")))
        server = EmbeddedRedis(directory=directory / "redis", args=scenario.server_args).start()
        stack.callback(server.stop)
        assert server.port is not None
        proxy = stack.enter_context(FaultProxy(server.host, server.port))
        admin = redis.Redis(host=server.host, port=server.port, socket_timeout=5)
        stack.callback(admin.close)
        canary = f"{tree.title}:{scenario.key}:{time.time()}"
        admin.set(CANARY_KEY, canary)
        reports = [directory / f"worker-{number}.json" for number in range(WORKERS)]
        workers = [start_worker(tree.root, proxy.url, server.url, report) for report in reports]

        def stop_workers() -> None:
            for worker in workers:  # our own processes, by their pid
                if worker.poll() is None:
                    worker.kill()
                worker.wait()

        stack.callback(stop_workers)
        package = tree.root / "django_redis_lock"
        for worker, report in zip(workers, reports, strict=True):
            assert worker.stdout is not None
            line = worker.stdout.readline().split()
            if not line or line[0] != "ready":
                raise worker_failure(report, "a worker did not start")
            if not Path(line[1]).resolve().is_relative_to(package.resolve()):
                raise RuntimeError(f"a worker imported {line[1]}, not the package of {package}")
        start = time.monotonic() + 0.5
        end = start + seconds
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(f"go {start} {end}\n")
            worker.stdin.close()
        instants = [start + PERIOD * k for k in range(1, int(seconds / PERIOD) + 1)]
        instants = [instant for instant in instants if instant < end - 0.5]
        for instant in instants:
            time.sleep(max(0.0, instant - time.monotonic()))
            began = time.monotonic()
            if scenario.key == "refuse":
                proxy.refuse()
                time.sleep(max(0.0, began + REFUSAL - time.monotonic()))
                proxy.accept()
            elif scenario.key == "aof":
                server.restart()  # SIGTERM (the AOF written), then the same port and directory
                if admin.get(CANARY_KEY) != canary.encode():
                    run.canary_lost += 1
            run.faults.append((began, time.monotonic()))
        for worker, report in zip(workers, reports, strict=True):
            try:
                worker.wait(timeout=max(1.0, end + LATE_REPORT - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise worker_failure(report, "a worker did not finish") from None
            if worker.returncode != 0 or not report.exists():
                raise worker_failure(report, f"a worker failed ({worker.returncode})")
            data = json.loads(report.read_text())
            events: dict[str, list[float]] = data["events"]

            def counted(kind: str, events: dict[str, list[float]] = events) -> list[float]:
                return [moment for moment in events[kind] if moment < end]

            run.acquired += counted("acquired")
            run.timeouts += len(counted("timeout"))
            run.failed_releases += len(counted("release"))
            run.backend_errors += len(counted("backend")) + len(counted("release"))
            run.critical_errors += len(counted("critical"))
            run.other_errors += len(counted("other")) + len(counted("critical"))
            run.overlaps += len(events["overlap"])  # after the end too: never ignored
            run.unrepaired += data["unrepaired"]
            for kind, count in data["other_kinds"].items():
                run.other_kinds[kind] = run.other_kinds.get(kind, 0) + count
    run.acquired.sort()
    run.seconds = seconds
    run.recoveries, run.stalled = recoveries(run.acquired, instants, end)
    first = instants[0] if instants else end
    run.rate_before = bisect.bisect_left(run.acquired, first) / (first - start)
    return run


# -- the report ------------------------------------------------------------------------------


def _seconds(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    return f"{max(values):.3f} / {statistics.median(values):.3f}"


def run_cells(run: Run) -> list[str]:
    if run.error:
        return ["error", "", "", "", "", "", "", "", ""]
    overlaps = f"**{run.overlaps} OVERLAPS**" if run.overlaps else "0"
    stalled = f" ({run.stalled} windows without an acquisition)" if run.stalled else ""
    return [
        f"{len(run.acquired):,}",
        f"{run.rate_before:,.0f}",
        f"{run.timeouts:,}",
        f"{run.backend_errors:,}",
        f"{run.failed_releases:,}",
        f"{run.other_errors:,}",
        overlaps,
        _seconds(run.recoveries) + stalled,
        str(len(run.recoveries)),
    ]


def notes(trees: Sequence[Tree], scenarios: Sequence[Scenario]) -> list[str]:
    lines = []
    for scenario in scenarios:
        for tree in trees:
            run = tree.runs.get(scenario.key)
            if run is None:
                continue
            where = f"{scenario.title}, {tree.title}"
            if run.error:
                lines.append(f"- {where}: **error**: {run.error}")
                continue
            if run.overlaps:
                lines.append(f"- {where}: **{run.overlaps} overlaps: two holders at once**")
            if run.other_kinds:
                kinds = ", ".join(f"{kind} x{count}" for kind, count in run.other_kinds.items())
                lines.append(f"- {where}: other errors (as raised, run's end included): {kinds}")
            if run.unrepaired:
                lines.append(
                    f"- {where}: {run.unrepaired} critical sections could not set `inside` back"
                    " to 0 (later overlap counts are suspect)"
                )
            if scenario.key == "aof" and run.faults:
                down = statistics.median(ended - began for began, ended in run.faults) * 1000
                kept = len(run.faults) - run.canary_lost
                lines.append(
                    f"- {where}: a restart took {down:.0f} ms (median, stop to answering);"
                    f" data kept after {kept} of {len(run.faults)} restarts"
                )
    return lines


def report(
    trees: Sequence[Tree], scenarios: Sequence[Scenario], seconds: float, redis_version: str
) -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    lines = [
        "# Faults that cut off queued waiters, under load",
        "",
        f"Run {now:%Y-%m-%d %H:%M} UTC by `benchmarks/bench_faults.py`; see its docstring."
        f" Machine: {os.cpu_count()} CPUs, Python {platform.python_version()},"
        f" Redis {redis_version}.",
        "",
        f"Parameters: {WORKERS} worker processes, {seconds:g} s per run, one lock,"
        f" `Lock(name, wait={WAIT:g})` (the default 30 s renewed lease), a critical section of"
        f" INCR, {CRITICAL_SECTION * 1000:g} ms sleep, DECR on a direct client; after a backend"
        f" error a worker pauses {ERROR_PAUSE * 1000:g} ms. A fault every {PERIOD:g} s from"
        f" {PERIOD:g} s in. The lock's cache: `OPTIONS = {CACHE_OPTIONS}`, through the proxy.",
        "",
        "Per s before the 1st fault: the acquisition rate until the first fault (the no-fault"
        " runs: the same instant), to tell the machine's own variation from a fault's cost."
        " Recovery: per fault, the longest gap between successive acquisitions (by anybody) from"
        " the last one before the fault until the next fault; max / median over the run's"
        " faults, in seconds (the no-fault runs: at the same instants).",
        "",
        "| scenario | package | acquisitions | per s before the 1st fault | timed-out waits |"
        " backend errors | of which failed releases | other errors | overlaps |"
        " recovery, max / median (s) | faults |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in scenarios:
        for tree in trees:
            run = tree.runs.get(scenario.key)
            if run is not None:
                cells = [scenario.title, tree.title, *run_cells(run)]
                lines.append("| " + " | ".join(cells) + " |")
    extra = notes(trees, scenarios)
    if extra:
        lines += ["", *extra]
    overlaps = sum(run.overlaps for tree in trees for run in tree.runs.values())
    if overlaps:
        lines += ["", f"**WARNING: {overlaps} OVERLAPS (two holders inside at once).**"]
    return "\n".join(lines) + "\n"


# -- main ------------------------------------------------------------------------------------


def _log(message: str) -> None:
    print(f"[bench_faults {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_all(
    trees: Sequence[Tree],
    scenarios: Sequence[Scenario],
    seconds: float,
    log: Callable[[str], None] = _log,
) -> None:
    for scenario in scenarios:
        for tree in trees:  # round robin: each tree sees the same machine
            log(f"{scenario.title}: {tree.title} ({seconds:g} s)")
            try:
                run = run_once(tree, scenario, seconds)
            except Exception as exc:
                run = Run(error=f"{type(exc).__name__}: {exc}")
            tree.runs[scenario.key] = run
            log(f"  {' | '.join(run_cells(run))}")


def redis_version() -> str:
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        try:
            info: dict[str, Any] = client.info("server")
            return str(info.get("redis_version", "?"))
        finally:
            client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SECONDS:g} s runs")
    parser.add_argument("--before", metavar="REF", help="also run the package at git REF")
    parser.add_argument("--scenario", choices=list(SCENARIO_BY_KEY), help="run this one only")
    args = parser.parse_args(argv)
    seconds = QUICK_SECONDS if args.quick else SECONDS
    scenarios = [SCENARIO_BY_KEY[args.scenario]] if args.scenario else SCENARIOS
    with contextlib.ExitStack() as stack:
        trees = [Tree("this tree", ROOT)]
        if args.before:
            worktree = stack.enter_context(worktree_at(args.before))
            trees.append(Tree(f"at {args.before}", worktree))
        version = redis_version()
        run_all(trees, scenarios, seconds)
    text = report(trees, scenarios, seconds, version)
    RESULTS.write_text(text)
    print(text)
    runs = [run for tree in trees for run in tree.runs.values()]
    if any(run.overlaps for run in runs):
        print("WARNING: OVERLAPS: two holders were inside at once; see above.", file=sys.stderr)
    return 1 if any(run.error or run.overlaps for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
