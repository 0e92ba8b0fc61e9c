"""3. Crash recovery: a holder with a short lease is SIGKILLed while another process waits; how
long until the waiter has the lock, after the kill and after the lease's end.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from benchmarks.harness.contention import stop_process
from benchmarks.harness.params import Params
from benchmarks.harness.rivals import configure_django
from benchmarks.harness.variants import VARIANT_BY_KEY, Variant


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
        stop_process(holder)
        if waiter.pid is not None:
            stop_process(waiter)


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
