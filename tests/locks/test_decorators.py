import asyncio
import inspect
import threading

import pytest
from asgiref.sync import iscoroutinefunction

from django_redis_lock import Lock, LockNotAcquired, lock
from django_redis_lock.primitives.keys import lock_keys


def held_names(redis_client):
    return sorted(
        key.decode().split("{", 1)[1].rstrip("}") for key in redis_client.scan_iter("lock:{*}")
    )


def test_constant_name(redis_client):
    @lock("nightly", timeout=10)
    def job():
        return held_names(redis_client)

    assert job() == ["nightly"]
    assert held_names(redis_client) == []


def test_template_from_positional_and_keyword_arguments(redis_client):
    @lock("import:{feed_id}:{mode}", timeout=10)
    def run_import(feed_id, mode="full"):
        return held_names(redis_client)

    assert run_import(42) == ["import:42:full"]
    assert run_import(7, mode="delta") == ["import:7:delta"]


def test_positional_template(redis_client):
    @lock("import:{0}", timeout=10)
    def run_import(feed_id):
        return held_names(redis_client)

    assert run_import(5) == ["import:5"]


def test_callable_name(redis_client):
    @lock(lambda user, amount: f"wallet:{user}", timeout=10)
    def pay(user, amount):
        return held_names(redis_client)

    assert pay("ann", 10) == ["wallet:ann"]


def test_busy_lock_raises_and_the_function_does_not_run():
    calls = []

    @lock("busy", wait=0)
    def job():
        calls.append(1)

    with Lock("busy", timeout=10):
        outcome = {}
        thread = threading.Thread(target=lambda: outcome.update(error=_raises(job)))
        thread.start()
        thread.join()
    assert isinstance(outcome["error"], LockNotAcquired)
    assert calls == []


def _raises(func):
    try:
        func()
    except Exception as exc:
        return exc
    return None


def test_bad_options_fail_when_decorating():
    with pytest.raises(ValueError, match="timeout"):
        lock("x", timeout=-1)
    with pytest.raises(TypeError):
        lock(42)(lambda: None)


def test_wraps_keeps_the_function_identity():
    @lock("named")
    def documented():
        """Docs."""

    assert documented.__name__ == "documented"
    assert documented.__doc__ == "Docs."


def test_async_function(redis_client):
    from django_redis_lock import aclose_async_redis_clients

    @lock("async-job:{0}", timeout=10)
    async def job(number):
        await asyncio.sleep(0)
        return redis_client.exists(lock_keys(f"async-job:{number}", "default").lease)

    async def main():
        try:
            return await job(3)
        finally:
            await aclose_async_redis_clients()

    # What Django (asgiref) and the standard library ask; asyncio's own is deprecated in 3.14.
    assert inspect.iscoroutinefunction(job)
    assert iscoroutinefunction(job)
    assert asyncio.run(main()) == 1
