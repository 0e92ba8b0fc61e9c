"""When a reply is lost or never comes: a release retried after its reply was lost, a release
cancelled in flight, an acquisition against a Redis that does not answer.

Replies are lost on purpose by a TCP proxy in front of the real server (``tests/proxy.py``):
the request reaches Redis, which runs it, and the reply is dropped or the connection reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time

import pytest

from django_redis_lock import (
    Lock,
    LockBackendError,
    LockNotOwned,
    lock_lost,
    lock_released,
)
from django_redis_lock.keys import lock_keys
from tests.conftest import django_redis_caches
from tests.helpers import run_async as run
from tests.helpers import wait_until
from tests.proxy import DROP_REPLIES, PASS, RESET_ON_REPLY


@pytest.fixture
def signals_seen():
    seen = []

    def lost(**kwargs):
        seen.append(("lost", kwargs["name"]))

    def released(**kwargs):
        seen.append(("released", kwargs["name"]))

    lock_lost.connect(lost, weak=False, dispatch_uid="test-lost-replies-lost")
    lock_released.connect(released, weak=False, dispatch_uid="test-lost-replies-released")
    yield seen
    lock_lost.disconnect(dispatch_uid="test-lost-replies-lost")
    lock_released.disconnect(dispatch_uid="test-lost-replies-released")


def errors(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def lease_key(name):
    return lock_keys(name, "default").lease


@pytest.fixture
def behind_proxy(settings, redis_proxy):
    """The locks talk to Redis through the proxy, their scripts already loaded (as in a
    process that has been running: a first call's NOSCRIPT would be a lost reply too)."""

    def configure(socket_timeout, **lock_settings):
        settings.CACHES = django_redis_caches(redis_proxy.url, SOCKET_TIMEOUT=socket_timeout)
        for name, value in lock_settings.items():
            setattr(settings, f"DJANGO_REDIS_LOCK_{name}", value)
        with Lock("warm-up", timeout=5, reentrant=True):
            pass
        return redis_proxy

    return configure


@pytest.mark.parametrize("failure", [DROP_REPLIES, RESET_ON_REPLY])
@pytest.mark.parametrize("options", [{"timeout": 10}, {}], ids=["fixed lease", "renewed lease"])
def test_a_release_whose_reply_was_lost_can_be_retried_quietly(
    behind_proxy, redis_client, caplog, signals_seen, failure, options
):
    redis_proxy = behind_proxy(0.5, TIMEOUT=0.6)  # the renewed lease: renewed every 0.2 s
    signals_seen.clear()
    lock = Lock("lost-reply", **options)
    lock.acquire()
    redis_proxy.mode = failure
    with pytest.raises(LockBackendError):
        lock.release()
    assert not redis_client.exists(lease_key("lost-reply"))  # Redis did release it
    redis_proxy.mode = PASS
    time.sleep(0.7)  # longer than the renewed lease: a renewal now would call it lost
    lock.release()  # the retry the docs promise: quiet
    assert lock.token is None
    assert errors(caplog) == []
    assert signals_seen == [("released", "lost-reply")]
    with pytest.raises(LockNotOwned):
        lock.release()  # and now it is gone from the object too


def test_a_lost_reply_on_one_level_of_a_reentrant_lock_takes_only_that_level(
    behind_proxy, redis_client, caplog, signals_seen
):
    redis_proxy = behind_proxy(0.5)
    signals_seen.clear()
    lock = Lock("levels", timeout=10, reentrant=True)
    lock.acquire()
    lock.acquire()
    redis_proxy.mode = DROP_REPLIES
    with pytest.raises(LockBackendError):
        lock.release()  # the inner level; Redis counted it, the reply is lost
    redis_proxy.mode = PASS
    assert redis_client.hget(lease_key("levels"), "count") == b"1"
    lock.release()  # the retry must not take the outer level too
    assert redis_client.hget(lease_key("levels"), "count") == b"1"
    assert lock.owned()
    lock.release()  # the outer level
    assert not redis_client.exists(lease_key("levels"))
    assert errors(caplog) == []
    assert signals_seen == [("released", "levels")]


def test_a_failed_release_stops_the_renewal_without_a_false_loss(
    behind_proxy, redis_client, caplog, signals_seen
):
    """Not retried: the lease is gone (Redis released it), and the renewal, which would find
    it gone, has stopped, so nobody is told of a loss that did not happen."""
    redis_proxy = behind_proxy(0.5, TIMEOUT=0.3)
    lock = Lock("no-retry")
    lock.acquire()
    redis_proxy.mode = DROP_REPLIES
    with pytest.raises(LockBackendError):
        lock.release()
    redis_proxy.mode = PASS
    time.sleep(1.0)  # three renewal periods
    assert errors(caplog) == []
    assert ("lost", "no-retry") not in signals_seen
    assert not lock.lost


def test_a_retry_still_reports_a_lease_that_ended_before_the_first_try(
    settings, redis_client, caplog, signals_seen
):
    """The quiet retry is for a release that was sent while the lease ran; one that was sent
    after it ended is the loss it always was."""
    lock = Lock("too-late", timeout=0.2)
    lock.acquire()
    wait_until(lambda: not redis_client.exists(lease_key("too-late")), 5, "the lease to end")
    with pytest.raises(LockNotOwned):
        lock.release()
    assert signals_seen == [("lost", "too-late")]


async def until(predicate, timeout=10):
    """wait_until for a coroutine: yields to the event loop between looks."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_release_cancelled_after_it_was_sent_leaves_a_consistent_lock(
    behind_proxy, redis_client, caplog, signals_seen
):
    """The holding task is cancelled while it waits for the reply, after Redis ran the
    release: the object keeps its token, and the retry succeeds quietly."""
    redis_proxy = behind_proxy(10)
    signals_seen.clear()
    seen = {}

    async def holder(lock):
        await lock.aacquire()
        seen["token"] = lock.token
        redis_proxy.mode = DROP_REPLIES
        try:
            await lock.arelease()
        except asyncio.CancelledError:
            seen["cancelled"] = True
        redis_proxy.mode = PASS
        seen["token after"] = lock.token  # kept, so that the release can be retried
        await lock.arelease()
        seen["token at the end"] = lock.token

    async def main():
        task = asyncio.create_task(holder(Lock("cancelled", timeout=10)))
        # Until the holder has taken the lock and Redis has run its release.
        await until(lambda: "token" in seen and not redis_client.exists(lease_key("cancelled")))
        task.cancel()
        await task

    run(main())
    assert seen["cancelled"]
    assert seen["token after"] == seen["token"]
    assert seen["token at the end"] is None
    assert errors(caplog) == []
    assert signals_seen == [("released", "cancelled")]


def test_an_acquisition_cancelled_after_redis_granted_it_gives_the_lock_back(
    behind_proxy, redis_client
):
    """Granted in Redis, the reply lost to the cancellation: without giving it back, the lock
    would stay taken for a whole lease by nobody."""
    redis_proxy = behind_proxy(2)

    async def main():
        async with Lock("warm-up-async", timeout=5):  # this loop's connection is made
            pass
        lock = Lock("granted-then-cancelled", timeout=30)
        redis_proxy.mode = DROP_REPLIES
        task = asyncio.create_task(lock.aacquire())
        await until(lambda: redis_client.exists(lease_key("granted-then-cancelled")))
        redis_proxy.mode = PASS  # that reply is gone; the next ones arrive
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert lock.token is None

    run(main())
    assert not redis_client.exists(lease_key("granted-then-cancelled"))


def test_release_cancellation_preserves_lock_state(redis_client):
    """redis-py's test of the same name, in the task that holds the lock (a hold is the
    task's): cancelled at its first pause, the release either did not happen (then the token
    is kept and a retry releases) or did (then the lock is free)."""

    async def main():
        lock = Lock("foo", timeout=10)
        await lock.aacquire(wait=0)
        original_token = lock.token
        assert redis_client.hget(lease_key("foo"), "token") == original_token.encode()
        asyncio.get_running_loop().call_soon(asyncio.current_task().cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await lock.arelease()
        if lock.token is not None:
            assert lock.token == original_token
            await lock.arelease()
        assert not redis_client.exists(lease_key("foo"))
        assert lock.token is None

    run(main())


# -- an acquisition against a Redis that does not answer -------------------------------------


@pytest.mark.parametrize("api", ["sync", "async"])
def test_an_acquisition_gives_up_when_its_wait_ends_even_if_redis_is_silent(
    settings, redis_server_factory, api
):
    """Before: acquire(wait=...) against a stalled Redis took the socket timeout (here 30 s),
    whatever its wait."""
    server = redis_server_factory()
    settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=30)
    Lock("warm-up", timeout=1).acquire()  # a connection in the pool, as in a running process
    outcome = {}

    def attempt():
        lock = Lock("silent", timeout=10)
        try:
            if api == "sync":
                lock.acquire(wait=1.5)
            else:
                run(lock.aacquire(wait=1.5))
        except LockBackendError as error:
            outcome["error"] = error

    os.kill(server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        thread = threading.Thread(target=attempt, daemon=True)
        thread.start()
        thread.join(15)
        elapsed = time.monotonic() - started
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert not thread.is_alive(), "acquire() waited for the socket timeout"
    assert elapsed >= 1.5
    assert "did not answer" in str(outcome["error"])
