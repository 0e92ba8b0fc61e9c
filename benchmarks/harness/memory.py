"""4. Memory per held lock: one process holds ``params.held`` locks at once; Redis
``used_memory`` with them held, less before, per lock. Each library's way of holding a lock on
a client shared by all its locks is a ``HeldRow``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from benchmarks.harness.params import Params
from benchmarks.harness.rivals import FifoOnPrivateLoop, Handle, RawLock, fifo_lease_key
from benchmarks.harness.variants import PG_ADVISORY, Variant

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


def held_rows(variants: Sequence[Variant]) -> list[HeldRow]:
    """The memory rows that stand for the chosen, runnable variants."""
    keys = {variant.key for variant in variants}
    return [row for row in HELD_ROWS if keys & set(row.variants)]
