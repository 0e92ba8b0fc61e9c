"""Benchmark django-redis-lock against the other Python Redis locks, on one private redis-server.

    make bench                       # or: .venv/bin/python benchmarks/bench.py [--quick]

Three measurements, each a function below:

1. ``measure_uncontended``: one process, acquire + release of a free lock, minus two PING
   round trips (so what is left is the lock's own cost above the network floor).
2. ``run_contended``: 6 processes fight for one lock, each doing a deliberately non-atomic
   counter update (GET, ~0.5 ms, SET) inside it, plus an overlap detector.
3. ``run_crash``: a holder with a 1 s lease is SIGKILLed while another process waits.

Requests (round trips) are counted on the client side, by wrapping redis-py's
``AbstractConnection.send_packed_command``: one call is one request sent, whether it carries one
command or a whole pipeline. Server-side ``INFO commandstats`` is not used for this, because it
also counts the commands a Lua script runs internally. See ``benchmarks/README.md`` for what
each number means. Results go to ``benchmarks/results.md`` (and stdout).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
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


FULL = Params()
QUICK = Params(cycles=1000, warmup=100, rounds=5, seconds=1.5, crash_trials=1)

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
    from django_redis_lock.keys import lock_keys

    # The lease comes from DJANGO_REDIS_LOCK_TIMEOUT and is renewed in the background; the
    # ``lease`` argument only matters through that setting (see configure_django).
    lock = Lock(name, wait=wait)
    return Handle(lock.acquire, lock.release, lock_keys(name, "default").lease)


def make_ours_fixed(url: str, name: str, lease: float, wait: float) -> Handle:
    from django_redis_lock import Lock
    from django_redis_lock.keys import lock_keys

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
    polling every RAW_POLL seconds while taken."""

    def __init__(self, url: str, name: str, lease: float, wait: float) -> None:
        self.client = redis.Redis.from_url(url)
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


def run_contended(ctx: Any, variant: Variant, url: str, params: Params) -> Contended:
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
        cpu_before = server_cpu(admin)
        go.set()
        give_up = time.monotonic() + params.seconds + params.wait + 60
        while len(reports) < params.workers and time.monotonic() < give_up:
            with contextlib.suppress(queue.Empty):
                worker, report = out.get(timeout=1)
                reports[worker] = report
        cpu_seconds = server_cpu(admin) - cpu_before
    finally:
        for process in processes:
            _stop(process)
    errors = [report["error"] for report in reports.values() if "error" in report]
    if errors or len(reports) < params.workers:
        missing = params.workers - len(reports)
        detail = errors[0].splitlines()[0] if errors else f"{missing} worker(s) never reported"
        print(errors[0] if errors else detail, file=sys.stderr)
        return Contended(error=detail)
    return summarize_contended(reports, cpu_seconds, int(admin.get(counter_key) or 0))


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
    crash: dict[str, Crash] = field(default_factory=dict)
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


def contended_latency_table(results: Results) -> list[str]:
    header = [
        "library",
        "acq/s",
        "handoff median ms",
        "handoff p99 ms",
        "same worker again",
        "wait median ms",
        "wait p99 ms",
        "wait max ms",
        "Jain",
        "acquisitions per worker",
    ]

    def cells(r: Contended) -> list[str]:
        return [
            _f(r.per_second),
            _f(r.handoff_median_ms, 3),
            _f(r.handoff_p99_ms, 3),
            f"{r.self_reacquired:.1%}",
            _f(r.wait_median_ms, 2),
            _f(r.wait_p99_ms, 2),
            _f(r.wait_max_ms, 1),
            f"{r.jain:.3f}",
            " ".join(map(str, r.per_worker)),
        ]

    return _library_table(results, results.contended, header, cells)


def contended_cost_table(results: Results) -> list[str]:
    header = [
        "library",
        "lock requests/acq",
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
            _f(r.work_requests, 2),
            _f(r.server_cpu_us, 1),
            _f(r.critical_section_ms, 3),
            str(r.overlaps),
            str(r.lost_updates),
            str(r.timeouts),
        ]

    return _library_table(results, results.contended, header, cells)


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
    what: str
    goal: str
    check: Callable[[Results, str], tuple[str, bool] | None]  # -> (measured, met) or None


def _t_cycle(results: Results, key: str) -> tuple[str, bool] | None:
    ours, raw = results.uncontended.get(key), results.uncontended.get("raw")
    if not ours or not raw or ours.error or raw.error or raw.above_median_us <= 0:
        return None
    ratio = ours.above_median_us / raw.above_median_us
    detail = f"{ours.above_median_us:.1f} µs vs floor {raw.above_median_us:.1f} µs = {ratio:.2f}x"
    return detail, ratio <= 1.3


def _contended_check(
    attribute: str, goal: Callable[[float], bool], fmt: str
) -> Callable[[Results, str], tuple[str, bool] | None]:
    def check(results: Results, key: str) -> tuple[str, bool] | None:
        result = results.contended.get(key)
        if not result or result.error:
            return None
        value = getattr(result, attribute)
        return fmt.format(value), goal(value)

    return check


def _t_cpu(results: Results, key: str) -> tuple[str, bool] | None:
    ours, other = results.contended.get(key), results.contended.get("python_redis_lock")
    if not ours or ours.error:
        return None
    if not other or other.error:
        return f"{ours.server_cpu_us:.1f} µs (python-redis-lock: n/a)", False
    detail = f"{ours.server_cpu_us:.1f} µs vs python-redis-lock {other.server_cpu_us:.1f} µs"
    return detail, ours.server_cpu_us <= other.server_cpu_us


def _t_safety(results: Results, key: str) -> tuple[str, bool] | None:
    result = results.contended.get(key)
    if not result or result.error:
        return None
    return f"{result.overlaps} overlaps, {result.lost_updates} lost", (
        result.overlaps == 0 and result.lost_updates == 0
    )


TARGETS = (
    Target("uncontended cycle - 2 RTT", "≤ 1.3 x raw floor", _t_cycle),
    Target(
        "handoff p99",
        "≤ 1 ms",
        _contended_check("handoff_p99_ms", lambda v: v <= 1.0, "{:.3f} ms"),
    ),
    Target("Jain fairness", "≥ 0.99", _contended_check("jain", lambda v: v >= 0.99, "{:.3f}")),
    Target(
        "wait p99", "≤ 10 ms", _contended_check("wait_p99_ms", lambda v: v <= 10.0, "{:.2f} ms")
    ),
    Target(
        "lock round trips per acquisition (contended)",
        "≤ 4",
        _contended_check("lock_requests", lambda v: v <= 4.0, "{:.2f}"),
    ),
    Target("server CPU per acquisition", "≤ python-redis-lock's", _t_cpu),
    Target("overlaps and lost updates", "0 and 0", _t_safety),
)


def targets_table(results: Results) -> list[str]:
    ours = [variant for variant in VARIANTS if variant.key in ("ours", "ours_t10")]
    header = ["target", "goal", *(v.title for v in ours)]
    rows = []
    for target in TARGETS:
        cells = [target.what, target.goal]
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


def render(results: Results) -> str:
    p = results.params
    lines = [
        "# django-redis-lock benchmark results",
        "",
        f"Written by `benchmarks/bench.py` (`make bench`) in {results.seconds:.0f} s. "
        "What each number means: `benchmarks/README.md`.",
        "",
        "## Machine",
        "",
    ]
    lines += [f"- **{key}**: {value}" for key, value in results.machine.items()]
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
        "4 per cycle excluded. Server CPU includes the critical section's commands.",
        "",
    ]
    lines += contended_latency_table(results)
    lines += [""]
    lines += contended_cost_table(results)
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
    lines += ["", "## Targets for django-redis-lock", ""]
    lines += targets_table(results)
    lines.append("")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    from django_redis_lock.embedded import EmbeddedRedis

    server = EmbeddedRedis().start()
    try:
        yield server.url
    finally:
        server.stop()


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
        ctx = process_context()
        for variant in runnable:
            _log(f"contended: {variant.key}")
            results.contended[variant.key] = run_contended(ctx, variant, url, params)
        for variant in runnable:
            _log(f"crash recovery: {variant.key}")
            results.crash[variant.key] = run_crash(ctx, variant, url, params)
    results.seconds = time.monotonic() - began
    report = render(results)
    args.output.write_text(report)
    print(report)
    _log(f"done in {results.seconds:.0f} s; written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
