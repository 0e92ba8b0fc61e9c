"""Metrics: what the instruments cost an acquisition, and how long a scrape of the gauges
takes on a Redis with many keys.

    make bench                      # or: .venv/bin/python benchmarks/bench_metrics.py [--quick]

One private redis-server (``bench.private_redis``). Two parts:

1. *Per acquisition*: one process takes and releases a free ``Lock`` (the default, renewed
   lease) over and over, in round-robin blocks of 200 cycles, with the metrics off, with the
   Prometheus exporter on, and with the OpenTelemetry one on (an SDK meter provider with an
   in-memory reader): the median of the blocks' client CPU time per cycle
   (``time.process_time_ns``; the server's time is not in it) and wall time per cycle, and
   the requests each cycle sends (``bench.RequestCounter``). Two blocks of "off" per round
   (A and B) show the noise floor: what "no measurable cost" is measured against. Off, the
   hooks are an empty-list check each (``reports.py``); its cost is timed on its own too.
   The exporters append their events on the lock's path and add them up when read
   (``metrics/buffer.py``): after each block, that ``settle()`` is timed too, per cycle.
   The exporter of ``prometheus_client``'s multi-process mode runs the same way in a child
   process with ``PROMETHEUS_MULTIPROC_DIR`` set (it is read once, at import).
2. *Scrape*: 99,000 keys that are not ours and 1,000 held locks; ``generate_latest`` of a
   registry holding the ``CensusCollector`` (one ``SCAN`` pass of the namespace, pipelined
   reads), 7 times: median and slowest.

No other Redis lock library exports metrics (python-redis-lock, pottery, redis-py's Lock,
sherlock, django-redis's ``lock()``: none; Redisson only logs), so there is nothing to put
beside these figures. Results go to ``benchmarks/results-metrics.md`` (and stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(ROOT), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

import bench  # noqa: E402
from bench import RequestCounter  # noqa: E402


@dataclass(frozen=True)
class Params:
    rounds: int = 40
    block: int = 200
    scrapes: int = 7
    locks: int = 1000
    other_keys: int = 99_000


QUICK = Params(rounds=8)


def _sinks(multiprocess: bool) -> dict[str, Any]:
    """The variants: name -> sink (None: metrics off)."""
    from prometheus_client import CollectorRegistry

    from django_redis_lock.metrics.prometheus import MultiProcessPrometheusSink

    if multiprocess:  # run in a process of its own, PROMETHEUS_MULTIPROC_DIR set before import
        return {
            "off (A)": None,
            "off (B)": None,
            MULTIPROCESS: MultiProcessPrometheusSink(registry=CollectorRegistry()),
        }
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from django_redis_lock.metrics.opentelemetry import OpenTelemetrySink
    from django_redis_lock.metrics.prometheus import PrometheusSink

    class Discard:  # a sink that does nothing: what reaching the sinks costs
        def waited(self, *args: Any) -> None: ...

        def held(self, *args: Any) -> None: ...

        def contended(self, *args: Any) -> None: ...

        def lost(self, *args: Any) -> None: ...

    return {
        "off (A)": None,
        "off (B)": None,
        "a sink that discards": Discard(),
        "prometheus": PrometheusSink(registry=CollectorRegistry()),
        "opentelemetry": OpenTelemetrySink(MeterProvider(metric_readers=[InMemoryMetricReader()])),
    }


MULTIPROCESS = "prometheus, multi-process mode"
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None


def per_acquisition(params: Params, multiprocess: bool = False) -> dict[str, dict[str, float]]:
    """Each variant's median client CPU and wall time per cycle, on the lock's path; for a sink
    that adds its events up later (``settle()``, as a scrape or a collection does), the CPU
    that takes per cycle, timed after each block; and requests per cycle."""
    from django_redis_lock import Lock
    from django_redis_lock.metrics import hub

    variants = _sinks(multiprocess)
    lock = Lock("bench:metrics:job")
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    later: dict[str, list[float]] = {name: [] for name in variants}
    requests: dict[str, float] = {}

    def cycles(count: int) -> None:
        for _ in range(count):
            with lock:
                pass

    def settle(sink: Any) -> float:
        if not hasattr(sink, "settle"):
            return 0.0
        started = time.process_time_ns()
        sink.settle()
        return (time.process_time_ns() - started) / 1000 / params.block

    for name, sink in variants.items():  # warm up each, and count its requests
        if sink is not None:
            hub.add(sink)
        cycles(params.block)
        counter = RequestCounter().install()
        try:
            cycles(100)
        finally:
            counter.uninstall()
        requests[name] = counter.counts["lock"] / 100
        if sink is not None:
            hub.remove(sink)
            settle(sink)
    names = list(variants)
    for round_index in range(params.rounds):
        # Each round starts at another variant: none always follows the same one.
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            sink = variants[name]
            if sink is not None:
                hub.add(sink)
            started_cpu, started = time.process_time_ns(), time.perf_counter_ns()
            cycles(params.block)
            cpu[name].append((time.process_time_ns() - started_cpu) / 1000 / params.block)
            wall[name].append((time.perf_counter_ns() - started) / 1000 / params.block)
            if sink is not None:
                hub.remove(sink)
                later[name].append(settle(sink))
    return {
        name: {
            "cpu_us": statistics.median(cpu[name]),
            "wall_us": statistics.median(wall[name]),
            "later_us": statistics.median(later[name]) if later[name] else 0.0,
            "requests": requests[name],
        }
        for name in variants
    }


def multiprocess_part(url: str, params: Params) -> dict[str, dict[str, float]]:
    """:func:`per_acquisition` of the multi-process mode's sink, in a process of its own
    (``prometheus_client`` reads ``PROMETHEUS_MULTIPROC_DIR`` once, when imported)."""
    with tempfile.TemporaryDirectory(dir=SHM) as directory:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
        command = [sys.executable, __file__, "--multiprocess-part", url, "--rounds",
                   str(params.rounds)]  # fmt: skip
        done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def off_check_ns() -> float:
    """What one hook costs with the metrics off: the check ``reports.py`` makes."""
    from django_redis_lock.metrics import hub

    assert not hub.sinks
    number = 1_000_000
    seconds = timeit.timeit("if hub.sinks: pass", globals={"hub": hub}, number=number)
    empty = timeit.timeit("pass", number=number)
    return max(0.0, (seconds - empty) / number * 1e9)


def scrape(url: str, params: Params) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, generate_latest

    from django_redis_lock import Lock
    from django_redis_lock.metrics.prometheus import CensusCollector

    client = redis.Redis.from_url(url)
    pipe = client.pipeline(transaction=False)
    for index in range(params.other_keys):
        pipe.set(f"cache:page:{index}", "x")
    pipe.execute()
    held = [Lock(f"import:{index}", timeout=600) for index in range(params.locks)]
    for each in held:
        assert each.acquire()
    registry = CollectorRegistry()
    CensusCollector(registry=registry)
    generate_latest(registry)  # warm
    times = []
    for _ in range(params.scrapes):
        started = time.perf_counter()
        text = generate_latest(registry).decode()
        times.append((time.perf_counter() - started) * 1000)
    held_line = next(line for line in text.splitlines() if line.startswith("redis_lock_held{"))
    keys = client.dbsize()
    for each in held:
        each.release()
    return {
        "median_ms": statistics.median(times),
        "max_ms": max(times),
        "keys": keys,
        "held_line": held_line,
    }


def cost_rows(
    costs: dict[str, dict[str, float]],
) -> tuple[list[str], dict[str, tuple[float, float]]]:
    """The table's rows, and each exporter's CPU over off per cycle: (on the path, in all)."""
    off = (costs["off (A)"]["cpu_us"] + costs["off (B)"]["cpu_us"]) / 2
    rows, over = [], {}
    for name, figures in costs.items():
        path = figures["cpu_us"] - off
        total = path + figures["later_us"]
        cells = ["", ""] if name.startswith("off") else [f"{path:+.1f} µs", f"{total:+.1f} µs"]
        rows.append(
            f"| {name} | {figures['cpu_us']:.1f} µs | {figures['wall_us']:.1f} µs | "
            f"{figures['later_us']:.1f} µs | {figures['requests']:.2f} | {' | '.join(cells)} |"
        )
        if not name.startswith("off") and name != "a sink that discards":
            over[name] = (path, total)
    return rows, over


def report(
    params: Params, ping_us: float, costs: dict[str, dict[str, float]],
    multiprocess: dict[str, dict[str, float]], check_ns: float, scraped: dict[str, Any],
) -> str:  # fmt: skip
    noise = abs(costs["off (A)"]["cpu_us"] - costs["off (B)"]["cpu_us"])
    header = [
        "| metrics | client CPU / cycle | wall / cycle | CPU added up later / cycle | "
        "requests / cycle | CPU over off, on the path | CPU over off, in all |",
        "|---|---|---|---|---|---|---|",
    ]
    rows, over = cost_rows(costs)
    multiprocess_rows, multiprocess_over = cost_rows(multiprocess)
    over.update(multiprocess_over)
    extra_trips = max(figures["requests"] for figures in [*costs.values(), *multiprocess.values()])
    extra_trips -= costs["off (A)"]["requests"]
    worst_path = max(path for path, _ in over.values())
    lines = [
        "# Metrics: cost per acquisition, and a scrape of the gauges",
        "",
        f"`benchmarks/bench_metrics.py`: {params.rounds} round-robin rounds of "
        f"{params.block}-cycle blocks per variant (acquire + release of a free `Lock`); "
        f"median PING round trip {ping_us:.0f} µs. No other Redis lock library exports "
        "metrics: nothing to compare with.",
        "",
        "*On the path*: the acquire and release themselves. *Added up later*: the events a sink "
        "appended, added up after each block (`settle()`, what a scrape or a collection does "
        "first), per cycle. *In all*: both.",
        "",
        *header,
        *rows,
        "",
        "Under `PROMETHEUS_MULTIPROC_DIR`, in a process of its own (its own off baseline):",
        "",
        *header,
        *multiprocess_rows,
        "",
        f"- **Metrics off**: each hook is one empty-list check, {check_ns:.0f} ns (a cycle "
        f"makes a handful); the two off variants differ by {noise:.1f} µs of CPU per cycle, "
        f"the noise floor. Goal *no measurable cost*: "
        f"{'met' if check_ns * 5 / 1000 < max(noise, 0.1) else 'NOT met'}.",
        f"- **Metrics on**: {extra_trips:+.2f} requests per cycle; client CPU over off per "
        "acquisition, on the path / in all: "
        + "; ".join(
            f"{name} {path:+.1f} / {total:+.1f} µs" for name, (path, total) in over.items()
        )
        + ". Goal *<= 5 µs and no extra round trip*: on the lock's path "
        f"{'met' if worst_path <= 5 and extra_trips <= 0 else 'NOT met'}; in all, "
        + ", ".join(
            f"{name} {'met' if total <= 5 else 'NOT met'}" for name, (_, total) in over.items()
        )
        + ".",
        f"- **Scrape**: {scraped['keys']:,} keys in Redis, {params.locks:,} of them locks: "
        f"median {scraped['median_ms']:.1f} ms, slowest {scraped['max_ms']:.1f} ms over "
        f"{params.scrapes} scrapes (`{scraped['held_line']}`). Goal *within 100 ms*: "
        f"{'met' if scraped['max_ms'] <= 100 else 'NOT met'}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--output", type=Path, default=HERE / "results-metrics.md")
    parser.add_argument("--multiprocess-part", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    params = QUICK if options.quick else Params()
    if options.rounds:
        params = replace(params, rounds=options.rounds)
    if options.multiprocess_part:  # the child multiprocess_part() starts: JSON to stdout
        bench.configure_django(options.multiprocess_part)
        print(json.dumps(per_acquisition(params, multiprocess=True)))
        return 0
    with bench.private_redis() as url:
        bench.configure_django(url)
        ping_us = bench.median_ping_us(url)
        costs = per_acquisition(params)
        multiprocess = multiprocess_part(url, params)
        check = off_check_ns()
        scraped = scrape(url, params)
    text = report(params, ping_us, costs, multiprocess, check, scraped)
    options.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
