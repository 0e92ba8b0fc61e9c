"""``bench.py``'s rows: each a rival lock (``rivals``) with its options and title, what it needs
to run, and, for the crash section, its lease and longest wait.
"""

from __future__ import annotations

import contextlib
import importlib
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from benchmarks.harness.params import Params
from benchmarks.harness.rivals import (
    FIFO_POLL_SECONDS,
    POSTGRES,
    POSTGRES_DSN_ENV,
    Handle,
    make_django_redis,
    make_ours_default,
    make_ours_fixed,
    make_ours_unfair,
    make_pg_advisory,
    make_pottery,
    make_python_redis_lock,
    make_raw,
    make_redis_fifo_lock,
    make_redis_py,
)
from benchmarks.harness.servers import PostgresUnavailable, environment, private_postgres

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
        hint = " (not installed: `pip install -r requirements/bench.txt`)" if missing else ""
        return f"{type(exc).__name__}: {exc}{hint}"
    return None


def chosen_variants(only: str) -> list[Variant]:
    """The variants ``--only`` names (every one when empty), in the tables' order."""
    chosen = [key for key in only.split(",") if key] or list(VARIANT_BY_KEY)
    unknown = set(chosen) - set(VARIANT_BY_KEY)
    if unknown:
        raise SystemExit(f"unknown variant(s): {', '.join(sorted(unknown))}")
    return [variant for variant in VARIANTS if variant.key in chosen]


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
            stack.enter_context(environment(POSTGRES_DSN_ENV, dsn))
            description = f"{version} (private, throw-away cluster, loopback TCP, fsync off)"
        yield description
