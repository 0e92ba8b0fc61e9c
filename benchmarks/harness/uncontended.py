"""1. Uncontended: one process, acquire + release of a free lock, minus two PING round trips (so
what is left is the lock's own cost above the network floor); and the PING round trip itself.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis

from benchmarks.harness.params import Params
from benchmarks.harness.records import RequestCounter, percentile, server_cpu
from benchmarks.harness.rivals import Handle
from benchmarks.harness.variants import Variant


@dataclass
class Uncontended:
    median_us: float = 0.0  # a whole cycle, wall clock
    p99_us: float = 0.0
    above_median_us: float = 0.0  # minus two PING round trips
    above_p99_us: float = 0.0
    client_cpu_us: float = 0.0  # this process's CPU per cycle (all its threads)
    server_cpu_us: float = 0.0  # redis-server's CPU per cycle
    requests: float = 0.0  # per cycle
    own_round_trips: float | None = None  # to the lock's own server (Handle.own_round_trips)
    lock_server: str = "Redis"  # where the lock lives (Variant.server)
    error: str | None = None


@dataclass
class _Tally:
    """What the blocks of one library (or of PING) added up to."""

    samples: list[float] = field(default_factory=list)  # µs per cycle
    client_cpu: float = 0.0  # seconds
    server_cpu: float = 0.0  # seconds
    cycles: int = 0

    def block(self, run: Callable[[int], list[float]], count: int, admin: redis.Redis) -> None:
        gc.collect()
        server_before = server_cpu(admin)
        client_before = time.process_time()
        self.samples += run(count)
        self.client_cpu += time.process_time() - client_before
        self.server_cpu += server_cpu(admin) - server_before
        self.cycles += count


def _cycles(handle: Handle) -> Callable[[int], list[float]]:
    def run(count: int) -> list[float]:
        samples = []
        clock = time.perf_counter_ns
        for _ in range(count):
            started = clock()
            if not handle.acquire():
                raise RuntimeError("a free lock was not acquired")
            handle.release()
            samples.append((clock() - started) / 1000)
        return samples

    return run


def _pings(client: redis.Redis) -> Callable[[int], list[float]]:
    def run(count: int) -> list[float]:
        samples = []
        clock = time.perf_counter_ns
        for _ in range(count):
            started = clock()
            client.ping()
            samples.append((clock() - started) / 1000)
        return samples

    return run


def median_ping_us(url: str, count: int = 1000, warmup: int = 200) -> float:
    """The median PING round trip to ``url`` in µs, after ``warmup`` unmeasured ones: the
    scripts' reference for "a round trip" beside their figures."""
    pings = _pings(redis.Redis.from_url(url))
    pings(warmup)
    return statistics.median(pings(count))


def _requests_per_cycle(handle: Handle, cycles: int = 200) -> float:
    counter = RequestCounter().install()
    try:
        _cycles(handle)(cycles)
    finally:
        counter.uninstall()
    return counter.counts["lock"] / cycles


@dataclass
class Ping:
    rtt_us: float = 0.0  # median
    client_cpu_us: float = 0.0
    server_cpu_us: float = 0.0


def measure_uncontended(
    variants: Sequence[Variant], url: str, params: Params
) -> tuple[Ping, dict[str, Uncontended]]:
    """PING round trip, and per variant the cycle time, taken in many short round-robin blocks
    so that a noisy neighbour (this is a shared 2-core machine) hurts every library alike."""
    admin = redis.Redis.from_url(url)
    pinger = redis.Redis.from_url(url)
    runs: dict[str, Callable[[int], list[float]]] = {}
    results: dict[str, Uncontended] = {}
    for variant in variants:
        try:
            handle = variant.factory(
                url, f"bench:uncontended:{variant.key}", params.lease, params.wait
            )
            _cycles(handle)(params.warmup)  # connect, load scripts, warm caches
            results[variant.key] = Uncontended(
                requests=_requests_per_cycle(handle),
                own_round_trips=handle.own_round_trips,
                lock_server=variant.server,
            )
            runs[variant.key] = _cycles(handle)
        except Exception as exc:
            results[variant.key] = Uncontended(error=f"{type(exc).__name__}: {exc}")
    _pings(pinger)(params.warmup)
    ping = _Tally()
    tallies = {key: _Tally() for key in runs}
    block = max(1, params.cycles // params.rounds)
    for _ in range(params.rounds):
        ping.block(_pings(pinger), block, admin)
        for key, run in runs.items():
            if results[key].error:
                continue
            try:
                tallies[key].block(run, block, admin)
            except Exception as exc:
                results[key].error = f"{type(exc).__name__}: {exc}"
    rtt = statistics.median(ping.samples)
    for key, tally in tallies.items():
        result = results[key]
        if result.error or not tally.samples:
            continue
        result.median_us = statistics.median(tally.samples)
        result.p99_us = percentile(tally.samples, 0.99)
        result.above_median_us = result.median_us - 2 * rtt
        result.above_p99_us = result.p99_us - 2 * rtt
        result.client_cpu_us = tally.client_cpu * 1e6 / tally.cycles
        result.server_cpu_us = tally.server_cpu * 1e6 / tally.cycles
    return Ping(
        rtt, ping.client_cpu * 1e6 / ping.cycles, ping.server_cpu * 1e6 / ping.cycles
    ), results
