"""Semaphore: what a permit costs beside a lock, and how 12 workers share 3 permits; and what
``lock_many`` costs beside taking the same locks one by one.

    make bench                      # or: .venv/bin/python -m benchmarks.bench_semaphore [--quick]

One private redis-server (``harness.servers.private_redis``). Three parts:

1. *Uncontended*: ``Semaphore(name, limit=3)`` and ``Lock(name)`` (both with the default,
   renewed lease) each acquired and released over and over by one process, in round-robin
   blocks of 100 so that a noisy neighbour hurts both alike. Requests are counted on every
   redis-py connection (``harness.records.RequestCounter``: one call, one round trip), for the
   acquisition and the release apart.
2. *Contended*: 12 processes (forkserver) for 10 s (``--quick``: 4 s) take a permit of one
   ``Semaphore(limit=3)``, run a critical section (an ``INCR`` of a server-side counter on
   entry, which must never pass 3, and a ``DECR`` on exit), and release it, as often as they
   can. Jain's index over the acquisitions per worker; *over-admissions*: entries that found
   more than 3 inside. *Handoff*: for each acquisition, the time from the latest release that
   another worker began before it to the acquisition's return (each worker's clock is the
   machine's ``CLOCK_MONOTONIC``; a release hands its permit to the first waiter, so this is
   that handoff's latency).
3. *lock_many*: ``lock_many`` of k = 2, 5 and 10 names sharing a hash tag (``{bank}:<i>``),
   uncontended: the round trips to acquire and to release it, and the cycle's median beside
   k plain ``Lock`` objects taken one by one in the same order.

Results go to ``benchmarks/results-semaphore.md`` (and stdout), with the issue's targets.
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness.contention import process_context
from benchmarks.harness.records import RequestCounter, WorkConnection, jain, percentile
from benchmarks.harness.rivals import configure_django
from benchmarks.harness.servers import private_redis
from benchmarks.harness.uncontended import median_ping_us

HERE = Path(__file__).resolve().parent

LIMIT = 3
WORKERS = 12


@dataclass(frozen=True)
class Params:
    cycles: int = 5000
    block: int = 100
    seconds: float = 10.0


QUICK = Params(cycles=1000, seconds=4.0)


# -- 1. uncontended ------------------------------------------------------------------------


def _requests(acquire: Callable[[], Any], release: Callable[[], Any]) -> tuple[float, float]:
    counter = RequestCounter().install()
    acquired = released = 0
    try:
        for _ in range(200):
            counter.reset()
            acquire()
            acquired += counter.counts["lock"]
            counter.reset()
            release()
            released += counter.counts["lock"]
    finally:
        counter.uninstall()
    return acquired / 200, released / 200


def uncontended(params: Params) -> dict[str, dict[str, float]]:
    from django_redis_lock import Lock, Semaphore

    pairs = {
        "Lock": Lock("bench:uncontended:lock", wait=0),
        "Semaphore(limit=3)": Semaphore("bench:uncontended:semaphore", limit=LIMIT, wait=0),
    }
    samples: dict[str, list[float]] = {key: [] for key in pairs}
    results: dict[str, dict[str, float]] = {}
    for key, primitive in pairs.items():
        for _ in range(200):  # warm up: connections, scripts
            primitive.acquire()
            primitive.release()
        acquire_rt, release_rt = _requests(primitive.acquire, primitive.release)
        results[key] = {"acquire_rt": acquire_rt, "release_rt": release_rt}
    clock = time.perf_counter_ns
    for _ in range(params.cycles // params.block):
        for key, primitive in pairs.items():
            for _ in range(params.block):
                started = clock()
                if not primitive.acquire():
                    raise RuntimeError(f"{key}: a free one was not acquired")
                primitive.release()
                samples[key].append((clock() - started) / 1000)
    for key, values in samples.items():
        results[key]["median_us"] = statistics.median(values)
        results[key]["p99_us"] = percentile(values, 0.99)
    return results


# -- 3. lock_many --------------------------------------------------------------------------

MANY_SIZES = (2, 5, 10)


def many(params: Params) -> list[dict[str, Any]]:
    from django_redis_lock import Lock, lock_many

    rows = []
    clock = time.perf_counter_ns
    for size in MANY_SIZES:
        names = [f"{{bank}}:{index}" for index in range(size)]
        group = lock_many(names, wait=0)
        locks = [Lock(name, wait=0) for name in names]

        def one_by_one(locks: list[Any] = locks) -> None:
            for lock in locks:
                if not lock.acquire():
                    raise RuntimeError("a free lock was not acquired")
            for lock in reversed(locks):
                lock.release()

        for _ in range(200):  # warm up: connections, scripts
            group.acquire()
            group.release()
            one_by_one()
        acquire_rt, release_rt = _requests(group.acquire, group.release)
        samples: dict[str, list[float]] = {"group": [], "one_by_one": []}
        for _ in range(params.cycles // params.block // 2):
            for _ in range(params.block):
                started = clock()
                if not group.acquire():
                    raise RuntimeError("lock_many: free locks were not acquired")
                group.release()
                samples["group"].append((clock() - started) / 1000)
            for _ in range(params.block):
                started = clock()
                one_by_one()
                samples["one_by_one"].append((clock() - started) / 1000)
        rows.append({
            "size": size, "acquire_rt": acquire_rt, "release_rt": release_rt,
            "median_us": statistics.median(samples["group"]),
            "one_by_one_us": statistics.median(samples["one_by_one"]),
        })  # fmt: skip
    return rows


# -- 2. contended --------------------------------------------------------------------------


def worker(url: str, index: int, seconds: float, ready: Any, go: Any, out: Any) -> None:
    try:
        configure_django(url)
        from django_redis_lock import Semaphore

        work = redis.Redis.from_url(url, connection_class=WorkConnection)
        semaphore = Semaphore("bench:contended:semaphore", limit=LIMIT, wait=60)
        with semaphore:  # warm up
            pass
        ready.wait(120)
        go.wait(120)
        cycles: list[tuple[float, float, float]] = []
        over = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            asked = time.monotonic()
            if not semaphore.acquire():
                continue
            got = time.monotonic()
            if work.incr("bench:inside") > LIMIT:
                over += 1
            work.decr("bench:inside")
            releasing = time.monotonic()
            semaphore.release()
            cycles.append((asked, got, releasing))
        out.put((index, {"cycles": cycles, "over": over}))
    except BaseException as exc:  # reported, not hidden
        out.put((index, {"error": f"{type(exc).__name__}: {exc}"}))


def contended(url: str, params: Params) -> dict[str, Any]:
    ctx = process_context()
    ready, go, out = ctx.Barrier(WORKERS + 1), ctx.Event(), ctx.Queue()
    processes = [
        ctx.Process(target=worker, args=(url, index, params.seconds, ready, go, out))
        for index in range(WORKERS)
    ]
    for process in processes:
        process.start()
    ready.wait(120)
    go.set()
    reports = dict(out.get(timeout=params.seconds + 120) for _ in processes)
    for process in processes:
        process.join(30)
    errors = [report["error"] for report in reports.values() if "error" in report]
    if errors:
        raise RuntimeError(errors[0])
    releases = sorted(
        (releasing, index)
        for index, report in reports.items()
        for _, _, releasing in report["cycles"]
    )
    times = [moment for moment, _ in releases]
    handoffs = []
    for index, report in reports.items():
        for _, got, _ in report["cycles"][1:]:
            position = bisect.bisect_right(times, got) - 1
            while position >= 0 and releases[position][1] == index:
                position -= 1
            if position >= 0:
                handoffs.append((got - times[position]) * 1000)
    counts = [len(reports[index]["cycles"]) for index in sorted(reports)]
    return {
        "acquisitions": sum(counts),
        "per_second": sum(counts) / params.seconds,
        "jain": jain(counts),
        "over": sum(report["over"] for report in reports.values()),
        "handoff_median_ms": statistics.median(handoffs),
        "handoff_p99_ms": percentile(handoffs, 0.99),
        "per_worker": counts,
    }


# -- report --------------------------------------------------------------------------------


def report(
    params: Params, rtt_us: float, calm: dict[str, Any], busy: dict[str, Any],
    groups: list[dict[str, Any]],
) -> str:  # fmt: skip
    lock, semaphore = calm["Lock"], calm["Semaphore(limit=3)"]
    ratio = semaphore["median_us"] / lock["median_us"]
    one_each = semaphore["acquire_rt"] == 1 and semaphore["release_rt"] == 1
    lines = [
        "# Semaphore: a permit's cost beside a lock's, and 12 workers on 3 permits",
        "",
        f"Written by `benchmarks/bench_semaphore.py` (`make bench`) on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; Python "
        f"{sys.version.split()[0]}; a private redis-server on loopback. Median PING round "
        f"trip: {rtt_us:.1f} µs.",
        "",
        f"## Uncontended: {params.cycles} cycles each, in round-robin blocks of {params.block}",
        "",
        "| primitive | round trips: acquire | release | cycle median µs | p99 µs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, row in calm.items():
        lines.append(
            f"| {key} | {row['acquire_rt']:.2f} | {row['release_rt']:.2f} | "
            f"{row['median_us']:.0f} | {row['p99_us']:.0f} |"
        )
    lines += [
        "",
        f"- one round trip to acquire and one to release (target): "
        f"{'met' if one_each else 'NOT met'}",
        f"- cycle **{ratio:.2f}x** the lock's (target: at most 1.3x): "
        f"{'met' if ratio <= 1.3 else 'NOT met'}",
        "",
        f"## Contended: {WORKERS} processes, limit={LIMIT}, {params.seconds:g} s",
        "",
        "| acquisitions | per second | Jain | over-admissions | handoff median ms | "
        "handoff p99 ms |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {busy['acquisitions']} | {busy['per_second']:.0f} | {busy['jain']:.4f} | "
        f"{busy['over']} | {busy['handoff_median_ms']:.3f} | {busy['handoff_p99_ms']:.3f} |",
        "",
        f"Acquisitions per worker: {busy['per_worker']}.",
        "",
        f"- Jain >= 0.99: {'met' if busy['jain'] >= 0.99 else 'NOT met'}; handoff p99 <= 1 ms: "
        f"{'met' if busy['handoff_p99_ms'] <= 1 else 'NOT met'}; 0 over-admissions: "
        f"{'met' if busy['over'] == 0 else 'NOT met'}",
        "",
        "## lock_many: k names sharing a hash tag, uncontended",
        "",
        "| k | round trips: acquire | release | cycle median µs | k Locks one by one µs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in groups:
        lines.append(
            f"| {row['size']} | {row['acquire_rt']:.2f} | {row['release_rt']:.2f} | "
            f"{row['median_us']:.0f} | {row['one_by_one_us']:.0f} |"
        )
    one_trip = all(row["acquire_rt"] == 1 for row in groups)
    lines += [
        "",
        f"- one round trip to acquire k names with one hash tag (target): "
        f"{'met' if one_trip else 'NOT met'}. A release is one round trip per name (each "
        "member hands its lock to its own first waiter).",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer cycles, a 4 s contention")
    parser.add_argument("--output", type=Path, default=HERE / "results-semaphore.md")
    options = parser.parse_args(argv)
    params = QUICK if options.quick else Params()
    with private_redis() as url:
        configure_django(url)
        ping_us = median_ping_us(url)
        calm = uncontended(params)
        busy = contended(url, params)
        groups = many(params)
    text = report(params, ping_us, calm, busy, groups)
    options.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
