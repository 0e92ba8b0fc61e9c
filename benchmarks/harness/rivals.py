"""The locks compared, each as a ``Handle``: ours, redis-py's, django-redis', python-redis-lock's,
pottery's, the raw floor, and two rivals of another kind, PostgreSQL's advisory locks (what
django-pglocks does) and the asyncio-only redis-fifo-lock. A factory takes
``(url, name, lease, wait)`` and returns a ``Handle``: one lock object, reused for every cycle.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

RAW_POLL = 0.001  # the raw floor's retry interval under contention
COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


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
