"""2. Contended: ``params.workers`` processes fight for one lock, each doing a deliberately
non-atomic counter update (GET, ~0.5 ms, SET) inside it, plus an overlap detector. Besides the
workers' own logs (acquisitions, handoffs, waits, requests), the server's CPU and the commands
it ran (``INFO commandstats``: in Redis 7 that includes the commands a Lua script runs, and the
``EVALSHA`` itself) are read around the run.
"""

from __future__ import annotations

import bisect
import contextlib
import multiprocessing
import queue
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import redis

from benchmarks.harness.params import Params
from benchmarks.harness.records import (
    RequestCounter,
    WorkConnection,
    command_calls,
    commands_between,
    jain,
    percentile,
    server_cpu,
)
from benchmarks.harness.rivals import configure_django
from benchmarks.harness.variants import VARIANT_BY_KEY, Variant


def _cs_keys(variant_key: str) -> tuple[str, str]:
    return f"bench:cs:{variant_key}:counter", f"bench:cs:{variant_key}:inside"


def contended_worker(
    variant_key: str, url: str, worker: int, params: Params, ready: Any, go: Any, out: Any
) -> None:
    """One of the contending processes. Sends back (worker, report dict) on ``out``."""
    try:
        configure_django(url)
        variant = VARIANT_BY_KEY[variant_key]
        handle = variant.factory(url, f"bench:contended:{variant_key}", params.lease, params.wait)
        work = redis.Redis.from_url(url, connection_class=WorkConnection)
        report = contend(
            handle, work, _cs_keys(variant_key), params.seconds, params.critical_section,
            ready, go,
        )  # fmt: skip
        out.put((worker, report))
    except BaseException as exc:
        out.put((worker, {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}))


def contend(
    handle: Any,
    work: redis.Redis,
    keys: tuple[str, str],
    seconds: float,
    critical_section: float,
    ready: Any,
    go: Any,
) -> dict[str, Any]:
    """Take and release ``handle`` for ``seconds`` once ``go`` is set, with a critical section
    of four round trips on ``work`` (plus ``critical_section`` seconds of sleep, if any); the
    report dict that ``summarize_contended`` reads."""
    counter_key, inside_key = keys
    work.ping()
    # Warm-up (connections, script loading), then count from zero.
    if not handle.acquire():
        raise RuntimeError("warm-up acquisition failed")
    handle.release()
    counter = RequestCounter().install()
    ready.wait(timeout=120)
    go.wait(timeout=120)
    counter.reset()
    started = time.monotonic()
    cpu_started = time.process_time()  # (every thread's: a renewal or watch thread's too)
    deadline = started + seconds
    cycles: list[tuple[float, float, float, float]] = []
    overlaps = timeouts = 0
    while time.monotonic() < deadline:
        asked = time.monotonic()
        if not handle.acquire():
            timeouts += 1
            continue
        got = time.monotonic()
        # The critical section: a lost-update-prone read-modify-write plus an overlap check.
        if work.incr(inside_key) != 1:
            overlaps += 1
        value = int(work.get(counter_key) or 0)
        if critical_section:
            time.sleep(critical_section)
        work.set(counter_key, value + 1)
        work.decr(inside_key)
        releasing = time.monotonic()
        handle.release()
        cycles.append((asked, got, releasing, time.monotonic()))
    cpu = time.process_time() - cpu_started
    counter.uninstall()
    return {
        "started": started,
        "cpu": cpu,
        "cycles": cycles,
        "overlaps": overlaps,
        "timeouts": timeouts,
        "requests": dict(counter.counts),
        "own_round_trips": getattr(handle, "own_round_trips", None),
    }


@dataclass
class Contended:
    acquisitions: int = 0
    per_second: float = 0.0
    handoffs: int = 0
    handoff_median_ms: float = 0.0
    handoff_p99_ms: float = 0.0
    self_reacquired: float = 0.0  # share of acquisitions that followed the same worker's release
    wait_median_ms: float = 0.0
    wait_p99_ms: float = 0.0
    wait_max_ms: float = 0.0
    jain: float = 0.0
    per_worker: list[int] = field(default_factory=list)
    lock_requests: float = 0.0  # per acquisition
    own_round_trips: float | None = None  # to the lock's own server (Handle.own_round_trips)
    lock_server: str = "Redis"  # where the lock lives (Variant.server)
    work_requests: float = 0.0  # per acquisition (4 expected)
    # Commands the server ran per acquisition (INFO commandstats, Lua's own included), less
    # the critical section's 4 and the harness' INFOs; and the same by command name.
    redis_commands: float = 0.0
    command_mix: dict[str, float] = field(default_factory=dict)
    server_cpu_us: float = 0.0  # per acquisition, critical section included
    # The contending processes' CPU per acquisition (every thread's), critical section included.
    client_cpu_us: float = 0.0
    critical_section_ms: float = 0.0  # median measured duration
    overlaps: int = 0
    lost_updates: int = 0
    timeouts: int = 0
    error: str | None = None
    not_applicable: str | None = None  # why this library has no such run (shown as n/a)


def summarize_contended(
    reports: dict[int, dict[str, Any]], cpu_seconds: float, counter_value: int
) -> Contended:
    """Turn the workers' timestamp logs into the contended numbers (see README)."""
    acquisitions = []  # (got, worker, asked)
    releases = []  # (releasing, worker)
    critical = []
    for worker, report in reports.items():
        for asked, got, releasing, _released in report["cycles"]:
            acquisitions.append((got, worker, asked))
            releases.append((releasing, worker))
            critical.append(releasing - got)
    acquisitions.sort()
    releases.sort()
    release_times = [moment for moment, _worker in releases]
    gaps, same = [], 0
    for got, worker, _asked in acquisitions:
        # The previous holder's release is the latest release started before this acquisition.
        index = bisect.bisect_left(release_times, got) - 1
        if index < 0:
            continue
        released_at, releaser = releases[index]
        if releaser == worker:
            same += 1
        else:
            gaps.append(got - released_at)
    total = len(acquisitions)
    waits = [got - asked for got, _worker, asked in acquisitions]
    started = min(report["started"] for report in reports.values())
    finished = max(release_times[-1:] or [started])
    per_worker = [len(reports[worker]["cycles"]) for worker in sorted(reports)]
    lock_requests = sum(report["requests"]["lock"] for report in reports.values())
    work_requests = sum(report["requests"]["work"] for report in reports.values())
    result = Contended(
        acquisitions=total,
        per_second=total / (finished - started) if finished > started else 0.0,
        handoffs=len(gaps),
        self_reacquired=same / max(1, total - 1),
        jain=jain(per_worker),
        per_worker=per_worker,
        lock_requests=lock_requests / max(1, total),
        own_round_trips=next((r.get("own_round_trips") for r in reports.values()), None),
        work_requests=work_requests / max(1, total),
        server_cpu_us=cpu_seconds * 1e6 / max(1, total),
        client_cpu_us=sum(report["cpu"] for report in reports.values()) * 1e6 / max(1, total),
        overlaps=sum(report["overlaps"] for report in reports.values()),
        lost_updates=total - counter_value,
        timeouts=sum(report["timeouts"] for report in reports.values()),
    )
    if gaps:
        result.handoff_median_ms = statistics.median(gaps) * 1000
        result.handoff_p99_ms = percentile(gaps, 0.99) * 1000
    if waits:
        result.wait_median_ms = statistics.median(waits) * 1000
        result.wait_p99_ms = percentile(waits, 0.99) * 1000
        result.wait_max_ms = max(waits) * 1000
    if critical:
        result.critical_section_ms = statistics.median(critical) * 1000
    return result


def stop_process(process: multiprocessing.process.BaseProcess) -> None:
    """End one of our own worker processes, by its pid."""
    process.join(timeout=5)
    if process.is_alive():
        process.kill()
        process.join(timeout=5)


# run_contended's own commands between its two command counts: the INFO commandstats of the
# first count (counted by the second, not by itself) and the two INFO cpu around the run.
CONTENDED_HARNESS = {"info": 3}
# The critical section's commands per acquisition (redis-py sends INCR and DECR as INCRBY 1
# and DECRBY 1).
CRITICAL_SECTION = {"incrby": 1, "get": 1, "set": 1, "decrby": 1}


def lock_commands(
    ran: dict[str, int], acquisitions: int, harness: dict[str, int]
) -> tuple[float, dict[str, float]]:
    """The lock's own commands per acquisition (total, and by name): what the server ran, less
    the harness' commands and the critical section's 4 per acquisition."""
    mix: dict[str, float] = {}
    for name, calls in ran.items():
        own = calls - harness.get(name, 0) - CRITICAL_SECTION.get(name, 0) * acquisitions
        if own:
            mix[name] = own / max(1, acquisitions)
    return sum(mix.values()), mix


def run_contended(ctx: Any, variant: Variant, url: str, params: Params) -> Contended:
    """``params.workers`` processes contend for one lock for ``params.seconds``. Besides the
    workers' own logs, the server's CPU and its command counts are read around the run: once
    every worker has warmed up (connected, loaded its scripts) and waits for the start signal,
    and once every worker has reported, so that the counts hold the run's commands and, of
    the harness, only CONTENDED_HARNESS."""
    admin = redis.Redis.from_url(url)
    counter_key, inside_key = _cs_keys(variant.key)
    admin.set(counter_key, 0)
    admin.delete(inside_key)
    ready = ctx.Barrier(params.workers + 1)
    go = ctx.Event()
    out = ctx.Queue()
    processes = [
        ctx.Process(
            target=contended_worker,
            args=(variant.key, url, worker, params, ready, go, out),
            name=f"bench-{variant.key}-{worker}",
        )
        for worker in range(params.workers)
    ]
    for process in processes:
        process.start()
    reports: dict[int, dict[str, Any]] = {}
    try:
        with contextlib.suppress(Exception):  # a worker that failed to start breaks it
            ready.wait(timeout=120)
        commands_before = command_calls(admin)
        cpu_before = server_cpu(admin)
        go.set()
        give_up = time.monotonic() + params.seconds + params.wait + 60
        while len(reports) < params.workers and time.monotonic() < give_up:
            with contextlib.suppress(queue.Empty):
                worker, report = out.get(timeout=1)
                reports[worker] = report
        cpu_seconds = server_cpu(admin) - cpu_before
        ran = commands_between(commands_before, command_calls(admin))
    finally:
        for process in processes:
            stop_process(process)
    errors = [report["error"] for report in reports.values() if "error" in report]
    if errors or len(reports) < params.workers:
        missing = params.workers - len(reports)
        detail = errors[0].splitlines()[0] if errors else f"{missing} worker(s) never reported"
        print(errors[0] if errors else detail, file=sys.stderr)
        return Contended(error=detail)
    result = summarize_contended(reports, cpu_seconds, int(admin.get(counter_key) or 0))
    result.lock_server = variant.server
    result.redis_commands, result.command_mix = lock_commands(
        ran, result.acquisitions, CONTENDED_HARNESS
    )
    return result


def process_context() -> Any:
    """forkserver: each process starts as a fork of a clean server that has already imported
    the libraries (fast, and nothing of the parent's connections or threads is inherited)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        [
            "django",
            "django.core.cache",
            "redis",
            "django_redis",
            "django_redis_lock",
            "redis_lock",
            "pottery",
            "redis.asyncio",
            "redis_fifo_lock",
            "psycopg",
        ]
    )
    return ctx
