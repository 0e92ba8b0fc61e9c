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
2. *Scrape*: 99,000 keys that are not ours and 1,000 held locks; ``generate_latest`` of a
   registry holding the ``CensusCollector`` (one ``SCAN`` pass of the namespace, pipelined
   reads), 7 times: median and slowest.

No other Redis lock library exports metrics (python-redis-lock, pottery, redis-py's Lock,
sherlock, django-redis's ``lock()``: none; Redisson only logs), so there is nothing to put
beside these figures. Results go to ``benchmarks/results-metrics.md`` (and stdout).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from collections.abc import Sequence
from dataclasses import dataclass
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


def _sinks() -> dict[str, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry

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


def per_acquisition(params: Params) -> dict[str, dict[str, float]]:
    from django_redis_lock import Lock
    from django_redis_lock.metrics import hub

    variants = _sinks()
    lock = Lock("bench:metrics:job")
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    requests: dict[str, float] = {}

    def cycles(count: int) -> None:
        for _ in range(count):
            with lock:
                pass

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
    return {
        name: {
            "cpu_us": statistics.median(cpu[name]),
            "wall_us": statistics.median(wall[name]),
            "requests": requests[name],
        }
        for name in variants
    }


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


def report(
    params: Params, ping_us: float, costs: dict[str, dict[str, float]], check_ns: float,
    scraped: dict[str, Any],
) -> str:  # fmt: skip
    off_a, off_b = costs["off (A)"], costs["off (B)"]
    noise = abs(off_a["cpu_us"] - off_b["cpu_us"])
    off = (off_a["cpu_us"] + off_b["cpu_us"]) / 2
    lines = [
        "# Metrics: cost per acquisition, and a scrape of the gauges",
        "",
        f"`benchmarks/bench_metrics.py`: {params.rounds} round-robin rounds of "
        f"{params.block}-cycle blocks per variant (acquire + release of a free `Lock`); "
        f"median PING round trip {ping_us:.0f} µs. No other Redis lock library exports "
        "metrics: nothing to compare with.",
        "",
        "| metrics | client CPU / cycle | wall / cycle | requests / cycle | CPU over off |",
        "|---|---|---|---|---|",
    ]
    for name, figures in costs.items():
        over = figures["cpu_us"] - off
        lines.append(
            f"| {name} | {figures['cpu_us']:.1f} µs | {figures['wall_us']:.1f} µs | "
            f"{figures['requests']:.2f} | {'' if name.startswith('off') else f'{over:+.1f} µs'} |"
        )
    worst = max(costs[name]["cpu_us"] - off for name in ("prometheus", "opentelemetry"))
    extra_trips = max(costs[name]["requests"] for name in costs) - off_a["requests"]
    lines += [
        "",
        f"- **Metrics off**: each hook is one empty-list check, {check_ns:.0f} ns (a cycle "
        f"makes a handful); the two off variants differ by {noise:.1f} µs of CPU per cycle, "
        f"the noise floor. Goal *no measurable cost*: "
        f"{'met' if check_ns * 5 / 1000 < max(noise, 0.1) else 'NOT met'}.",
        f"- **Metrics on**: at most {worst:+.1f} µs of client CPU per acquisition over off, "
        f"{extra_trips:+.2f} requests. Goal *<= 5 µs and no extra round trip*: "
        f"{'met' if worst <= 5 and extra_trips <= 0 else 'NOT met'}.",
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
    options = parser.parse_args(argv)
    params = QUICK if options.quick else Params()
    with bench.private_redis() as url:
        bench.configure_django(url)
        ping_us = bench.median_ping_us(url)
        costs = per_acquisition(params)
        check = off_check_ns()
        scraped = scrape(url, params)
    text = report(params, ping_us, costs, check, scraped)
    options.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
