"""Metrics: what the instruments cost an acquisition, and how long a scrape of the gauges
takes on a Redis with many keys.

    make bench                      # or: .venv/bin/python -m benchmarks.bench_metrics [--quick]

One private redis-server (``harness.servers.private_redis``). Two parts:

1. *Per acquisition*: one process takes and releases a free ``Lock`` (the default, renewed
   lease) over and over, in round-robin blocks of 200 cycles, with the metrics off, with the
   Prometheus exporter on, and with the OpenTelemetry one on (an SDK meter provider with an
   in-memory reader): the median of the blocks' client CPU time per cycle
   (``time.process_time_ns``; the server's time is not in it) and wall time per cycle, and
   the requests each cycle sends (``harness.records.RequestCounter``). Two blocks of "off" per
   round (A and B) show the noise floor: what "no measurable cost" is measured against. Off, the
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness.machine import ROOT
from benchmarks.harness.records import RequestCounter
from benchmarks.harness.rivals import configure_django
from benchmarks.harness.servers import private_redis
from benchmarks.harness.uncontended import median_ping_us

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Params:
    rounds: int = 40
    block: int = 200
    scrapes: int = 7
    hook_pairs: int = 4_000  # 8,000 events: fewer than OpenTelemetry's sink keeps
    hook_repeats: int = 15
    locks: int = 1000
    other_keys: int = 99_000


QUICK = Params(rounds=8, hook_repeats=5)


def _sinks(multiprocess: bool) -> dict[str, Any]:
    """The variants: name -> sink (None: metrics off)."""
    from prometheus_client import CollectorRegistry

    from django_redis_lock.metrics.prometheus import MultiProcessPrometheusSink

    if multiprocess:  # run in a process of its own, PROMETHEUS_MULTIPROC_DIR set before import
        return {
            "off (A)": None,
            "off (B)": None,
            MULTIPROCESS: MultiProcessPrometheusSink(),
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
    from django_redis_lock.primitives import reports

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

    for name, sink in variants.items():  # warm up each, and count its requests
        if sink is not None:
            reports.add_sink(sink)
        cycles(params.block)
        counter = RequestCounter().install()
        try:
            cycles(100)
        finally:
            counter.uninstall()
        requests[name] = counter.counts["lock"] / 100
        if sink is not None:
            reports.remove_sink(sink)
            settle_us(sink, params.block)
    for name, sink in in_rotation(variants, params.rounds):
        if sink is not None:
            reports.add_sink(sink)
        started_cpu, started = time.process_time_ns(), time.perf_counter_ns()
        cycles(params.block)
        cpu[name].append((time.process_time_ns() - started_cpu) / 1000 / params.block)
        wall[name].append((time.perf_counter_ns() - started) / 1000 / params.block)
        if sink is not None:
            reports.remove_sink(sink)
            later[name].append(settle_us(sink, params.block))
    return {
        name: {
            "cpu_us": statistics.median(cpu[name]),
            "wall_us": statistics.median(wall[name]),
            "later_us": statistics.median(later[name]) if later[name] else 0.0,
            "requests": requests[name],
        }
        for name in variants
    }


def hook_costs(params: Params, multiprocess: bool = False) -> dict[str, dict[str, float]]:
    """What the metrics add to an acquisition and release, clear of the network's noise (on
    the benchmark VM, two "off" blocks of cycles can differ by several µs): the two hooks every
    cycle calls (``reports.acquired``, ``reports.released``) on a real ``Lock``, in loops of
    ``hook_pairs``, ``hook_repeats`` times per variant in rotation. Each variant's median CPU per
    pair over off's, and the ``settle()`` after each loop, per pair, in µs."""
    from django_redis_lock import Lock
    from django_redis_lock.primitives import reports

    variants = _sinks(multiprocess)
    lock = Lock("bench:metrics:hooks")
    path: dict[str, list[float]] = {name: [] for name in variants}
    later: dict[str, list[float]] = {name: [] for name in variants}
    for name, sink in in_rotation(variants, params.hook_repeats):
        if sink is not None:
            reports.add_sink(sink)
        started = time.process_time_ns()
        for _ in range(params.hook_pairs):
            reports.acquired(lock, 0.0002, None)
            reports.released(lock, 0.0005)
        path[name].append((time.process_time_ns() - started) / 1000 / params.hook_pairs)
        if sink is not None:
            reports.remove_sink(sink)
        later[name].append(settle_us(sink, params.hook_pairs))
    off = statistics.median(path["off (A)"] + path["off (B)"])
    return {
        name: {
            "path_us": statistics.median(path[name]) - off,
            "later_us": statistics.median(later[name]),
        }
        for name in variants
    }


def in_rotation(variants: dict[str, Any], rounds: int) -> Iterator[tuple[str, Any]]:
    """Each variant once a round, each round starting at another: none always follows the
    same one."""
    names = list(variants)
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            yield name, variants[name]


def settle_us(sink: Any, per: int) -> float:
    """The CPU of adding up what ``sink`` appended (none for a sink that appends nothing), in
    µs per ``per``."""
    if not hasattr(sink, "settle"):
        return 0.0
    started = time.process_time_ns()
    sink.settle()
    return (time.process_time_ns() - started) / 1000 / per


def opentelemetry_floor_us(params: Params) -> float:
    """What the OpenTelemetry SDK takes for the two measurements of an acquisition and release,
    whoever records them: its ``record()`` alone, attributes made once, in µs per pair."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("floor")
    wait, hold = meter.create_histogram("wait", unit="s"), meter.create_histogram("hold", unit="s")
    waited = {"kind": "lock", "group": "bench", "outcome": "acquired"}
    held = {"kind": "lock", "group": "bench"}
    times = []
    for _ in range(params.hook_repeats):
        started = time.process_time_ns()
        for _ in range(params.hook_pairs):
            wait.record(0.0002, waited)
            hold.record(0.0005, held)
        times.append((time.process_time_ns() - started) / 1000 / params.hook_pairs)
    return statistics.median(times)


def multiprocess_part(url: str, params: Params) -> dict[str, dict[str, dict[str, float]]]:
    """:func:`per_acquisition` and :func:`hook_costs` of the multi-process mode's sink, in a
    process of its own (``prometheus_client`` reads ``PROMETHEUS_MULTIPROC_DIR`` once, when
    imported): ``{"cycles": ..., "hooks": ...}``."""
    with tempfile.TemporaryDirectory(dir=SHM) as directory:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
        command = [
            sys.executable, "-m", "benchmarks.bench_metrics", "--multiprocess-part", url,
            "--rounds", str(params.rounds), "--hook-repeats", str(params.hook_repeats),
        ]  # fmt: skip
        done = subprocess.run(
            command, cwd=ROOT, env=env, check=True, capture_output=True, text=True
        )
    return json.loads(done.stdout)


def off_check_ns() -> float:
    """What one hook costs with the metrics off: the check ``reports.py`` makes."""
    from django_redis_lock.primitives import reports

    assert not reports.sinks
    number = 1_000_000
    seconds = timeit.timeit("if reports.sinks: pass", globals={"reports": reports}, number=number)
    empty = timeit.timeit("pass", number=number)
    return max(0.0, (seconds - empty) / number * 1e9)


def scrape(url: str, params: Params) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, generate_latest

    from django_redis_lock import Lock
    from django_redis_lock.metrics.prometheus import CensusCollector
    from django_redis_lock.primitives.keys import namespace
    from django_redis_lock.registry.locks import glob_escape

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
    pattern = glob_escape(namespace("default")) + "{*"  # the census's
    times, floor = [], []
    for _ in range(params.scrapes):
        started = time.perf_counter()
        text = generate_latest(registry).decode()
        times.append((time.perf_counter() - started) * 1000)
        # The floor: redis-py's scan_iter over the same keys and pattern, reading nothing.
        started = time.perf_counter()
        for _key in client.scan_iter(match=pattern, count=2000):
            pass
        floor.append((time.perf_counter() - started) * 1000)
    held_line = next(line for line in text.splitlines() if line.startswith("redis_lock_held{"))
    keys = client.dbsize()
    for each in held:
        each.release()
    return {
        "median_ms": statistics.median(times),
        "max_ms": max(times),
        "floor_ms": statistics.median(floor),
        "keys": keys,
        "held_line": held_line,
    }


def verdict(total_us: float, path_us: float, extra_trips: float) -> str:
    """The per-acquisition goal for one exporter: in all, else on the lock's path alone."""
    if extra_trips > 0:
        return "NOT met (a request more)"
    if total_us <= 5:
        return "met"
    return "NOT met in all (on the path: met)" if path_us <= 5 else "NOT met"


def cycle_rows(costs: dict[str, dict[str, float]]) -> list[str]:
    return [
        f"| {name} | {figures['cpu_us']:.1f} µs | {figures['wall_us']:.1f} µs | "
        f"{figures['requests']:.2f} |"
        for name, figures in costs.items()
    ]


def report(
    params: Params, ping_us: float, costs: dict[str, dict[str, float]],
    hooks: dict[str, dict[str, float]], multiprocess: dict[str, dict[str, dict[str, float]]],
    check_ns: float, floor_us: float, scraped: dict[str, Any],
) -> str:  # fmt: skip
    noise = abs(costs["off (A)"]["cpu_us"] - costs["off (B)"]["cpu_us"])
    measured = {**hooks, **multiprocess["hooks"]}
    totals = {name: figures["path_us"] + figures["later_us"] for name, figures in measured.items()}
    exporters = {
        name: figures
        for name, figures in measured.items()
        if not name.startswith("off") and name != "a sink that discards"
    }
    every_cycle = [*costs.values(), *multiprocess["cycles"].values()]
    extra_trips = max(figures["requests"] for figures in every_cycle)
    extra_trips -= costs["off (A)"]["requests"]
    lines = [
        "# Metrics: cost per acquisition, and a scrape of the gauges",
        "",
        f"`benchmarks/bench_metrics.py`: median PING round trip {ping_us:.0f} µs. No other "
        "Redis lock library exports metrics: nothing to compare with.",
        "",
        "## What the metrics add to an acquisition and release",
        "",
        f"The two hooks a cycle calls (`reports.acquired`, `reports.released`) on a real `Lock`, "
        f"{params.hook_repeats} loops of {params.hook_pairs:,} per variant in rotation: the "
        "median client CPU per acquisition and release over off. *On the path*: in the "
        "acquisition and release. *Added up later*: the events a sink appended, added up after "
        "each loop (`settle()`, what a scrape or a collection does first). "
        "Multi-process mode: in a child process with `PROMETHEUS_MULTIPROC_DIR` set.",
        "",
        "| exporter | on the path | added up later | in all |",
        "|---|---|---|---|",
        *(
            f"| {name} | {figures['path_us']:+.2f} µs | {figures['later_us']:.2f} µs | "
            f"{totals[name]:+.2f} µs |"
            for name, figures in measured.items()
            if not name.startswith("off")
        ),
        "",
        "## Whole cycles",
        "",
        f"{params.rounds} round-robin rounds of {params.block}-cycle blocks per variant "
        "(acquire + release of a free `Lock` on the private redis-server); the two off "
        f"variants show the noise of a whole cycle on this machine ({noise:.1f} µs).",
        "",
        "| metrics | client CPU / cycle | wall / cycle | requests / cycle |",
        "|---|---|---|---|",
        *cycle_rows(costs),
        "",
        "In a child process with `PROMETHEUS_MULTIPROC_DIR` set:",
        "",
        "| metrics | client CPU / cycle | wall / cycle | requests / cycle |",
        "|---|---|---|---|",
        *cycle_rows(multiprocess["cycles"]),
        "",
        "## Goals",
        "",
        f"- **Metrics off**: each hook is one empty-list check, {check_ns:.0f} ns (a cycle "
        f"makes a handful), under the noise of a cycle ({noise:.1f} µs). Goal *no measurable "
        f"cost*: {'met' if check_ns * 5 / 1000 < max(noise, 0.1) else 'NOT met'}.",
        f"- **Metrics on**: {extra_trips:+.2f} requests per cycle. Client CPU per acquisition "
        "and release, on the path / in all: "
        + "; ".join(
            f"{name} {figures['path_us']:+.2f} / {totals[name]:+.2f} µs"
            for name, figures in exporters.items()
        )
        + ". Goal *<= 5 µs and no extra round trip*: "
        + "; ".join(
            f"{name}: {verdict(totals[name], figures['path_us'], extra_trips)}"
            for name, figures in exporters.items()
        )
        + f". OpenTelemetry's floor: its SDK's `record()` alone, for an acquisition's two "
        f"measurements, takes {floor_us:.2f} µs here; an exporter through its API can add them "
        "up later, off the lock's path, not skip them. The rest, ours: "
        f"{totals['opentelemetry'] - floor_us:+.2f} µs.",
        f"- **Scrape**: {scraped['keys']:,} keys in Redis, {params.locks:,} of them locks: "
        f"median {scraped['median_ms']:.1f} ms, slowest {scraped['max_ms']:.1f} ms over "
        f"{params.scrapes} scrapes (`{scraped['held_line']}`); a bare `SCAN` pass of the "
        f"same keys with redis-py's `scan_iter`, reading nothing: median "
        f"{scraped['floor_ms']:.1f} ms. Goal *within 100 ms*: "
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
    parser.add_argument("--hook-repeats", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    params = QUICK if options.quick else Params()
    if options.rounds:
        params = replace(params, rounds=options.rounds)
    if options.hook_repeats:
        params = replace(params, hook_repeats=options.hook_repeats)
    if options.multiprocess_part:  # the child multiprocess_part() starts: JSON to stdout
        configure_django(options.multiprocess_part)
        cycles, hooks = per_acquisition(params, True), hook_costs(params, True)
        print(json.dumps({"cycles": cycles, "hooks": hooks}))
        return 0
    with private_redis() as url:
        configure_django(url)
        ping_us = median_ping_us(url)
        costs = per_acquisition(params)
        hooks = hook_costs(params)
        multiprocess = multiprocess_part(url, params)
        check, floor = off_check_ns(), opentelemetry_floor_us(params)
        scraped = scrape(url, params)
    text = report(params, ping_us, costs, hooks, multiprocess, check, floor, scraped)
    options.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
