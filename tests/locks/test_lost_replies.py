"""When a reply is lost or never comes: a release retried after its reply was lost, a release
cancelled in flight, an acquisition against a Redis that does not answer.

Replies are lost on purpose by a TCP proxy in front of the real server
(``tests/support/proxy.py``): the request reaches Redis, which runs it, and the reply is dropped
or the connection reset.
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
import redis

from django_redis_lock import (
    Lock,
    LockBackendError,
    LockNotOwned,
    get_redis_client,
    lock_lost,
    lock_many,
    lock_released,
)
from django_redis_lock.backends.base import aone_by_one, one_by_one
from django_redis_lock.primitives.background.renewal import renewer
from django_redis_lock.primitives.keys import lock_keys
from tests.conftest import django_redis_caches
from tests.support.helpers import free_port, lease_token, wait_until
from tests.support.helpers import run_async as run
from tests.support.proxy import DROP_REPLIES, PASS, REFUSE, RESET_ON_REPLY


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
    redis_proxy = behind_proxy(0.5, TIMEOUT=1.5)  # the renewed lease: renewed every 0.5 s
    signals_seen.clear()
    lock = Lock("lost-reply", **options)
    lock.acquire()
    redis_proxy.mode = failure
    with pytest.raises(LockBackendError):
        lock.release()
    assert not redis_client.exists(lease_key("lost-reply"))  # Redis did release it
    redis_proxy.mode = PASS
    time.sleep(1.7)  # longer than the renewed lease: a renewal now would call it lost
    lock.release()  # the retry the docs promise: quiet
    assert lock.token is None
    assert errors(caplog) == []
    assert signals_seen == [("released", "lost-reply")]
    with pytest.raises(LockNotOwned):
        lock.release()  # and now it is gone from the object too


def test_an_inner_level_of_a_reentrant_lock_has_no_reply_to_lose(
    behind_proxy, redis_client, caplog, signals_seen
):
    """Levels are counted in the process: releasing an inner one sends nothing, so no lost
    reply can take a second level (as a count kept in Redis could)."""
    redis_proxy = behind_proxy(0.5)
    signals_seen.clear()
    lock = Lock("levels", timeout=10, reentrant=True)
    lock.acquire()
    lock.acquire()
    redis_proxy.mode = DROP_REPLIES
    lock.release()  # the inner level: nothing sent
    redis_proxy.mode = PASS
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
    # Given back on the same connection, right after the cancelled request (through the proxy).
    wait_until(lambda: not redis_client.exists(lease_key("granted-then-cancelled")), 10)


def test_release_cancellation_preserves_lock_state(redis_client):
    """redis-py's test of the same name, in the task that holds the lock (a hold is the
    task's): cancelled at its first pause, the release either did not happen (then the token
    is kept and a retry releases) or did (then the lock is free)."""

    async def main():
        lock = Lock("foo", timeout=10)
        await lock.aacquire(wait=0)
        original_token = lock.token
        assert lease_token(redis_client, lease_key("foo")) == original_token
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


# -- what a quiet retry must not hide, and what a lost reply must not leave behind -------------


def test_a_retry_after_a_try_that_was_never_sent_reports_a_real_loss(
    behind_proxy, redis_client, signals_seen
):
    """The lease was deleted (force-released, a failover) and taken by someone else; the
    first release could not even connect: the retry's 'not ours' is the loss it is."""
    redis_proxy = behind_proxy(0.5)
    lock = Lock("stolen", timeout=10)
    lock.acquire()
    redis_client.delete(lease_key("stolen"))
    assert Lock("stolen", timeout=10).acquire()  # another holder
    redis_proxy.mode = REFUSE
    redis_proxy.cut_connections()
    get_redis_client().connection_pool.disconnect()  # no pooled connection: a new one fails
    with pytest.raises(LockBackendError):
        lock.release()
    redis_proxy.mode = PASS
    with pytest.raises(LockNotOwned):
        lock.release()
    assert ("lost", "stolen") in signals_seen


def test_nested_with_blocks_release_both_levels_when_their_replies_are_lost(
    behind_proxy, redis_client, caplog, signals_seen
):
    """The inner exit is counted in the process; the outer exit's release runs in Redis and its
    reply is lost: the retry is quiet, and nothing is left taken by nobody."""
    redis_proxy = behind_proxy(0.5)
    signals_seen.clear()
    lock = Lock("nested", timeout=10, reentrant=True)
    with pytest.raises(LockBackendError), lock, lock:
        redis_proxy.mode = DROP_REPLIES
    redis_proxy.mode = PASS
    assert not redis_client.exists(lease_key("nested"))  # the outer exit's release ran
    lock.release()  # its retry: quiet, the earlier try got through
    assert errors(caplog) == []
    assert not redis_client.exists(lease_key("nested"))
    assert lock.token is None
    assert signals_seen == [("released", "nested")]


def test_a_failed_release_is_finished_by_the_next_acquisition(
    behind_proxy, redis_client, caplog, signals_seen
):
    """Nobody retried it: the next `with` on the object finishes it first, then takes a new,
    renewed lease (not a re-entry into a hold that is no longer renewed)."""
    redis_proxy = behind_proxy(0.5, TIMEOUT=1)
    signals_seen.clear()
    lock = Lock("reused")
    lock.acquire()
    first_token = lock.token
    redis_proxy.mode = DROP_REPLIES
    with pytest.raises(LockBackendError):
        lock.release()
    redis_proxy.mode = PASS
    with lock as held:
        assert held.token != first_token
        assert renewer.renewing(held._book.hold())
        time.sleep(1.2)  # more than a lease: it is renewed
        assert held.owned()
    assert signals_seen == [("released", "reused"), ("released", "reused")]
    assert errors(caplog) == []


def _given_up_on_a_stopped_server(server, api, primitive):
    """``primitive.acquire(wait=0)`` (or ``aacquire``) while ``server`` is stopped (SIGSTOP),
    until it gives up; then the server goes on, and runs what it was sent. Returns what the
    acquisition got: ``{"got": ...}`` or ``{"error": LockBackendError}``."""
    outcome = {}

    def attempt():
        try:
            outcome["got"] = primitive.acquire(wait=0) if api == "sync" else run(warm_then())
        except LockBackendError as error:
            outcome["error"] = error

    async def warm_then():
        async with Lock("async-warm-up", timeout=1):
            pass
        os.kill(server.pid, signal.SIGSTOP)
        return await primitive.aacquire(wait=0)

    if api == "sync":
        os.kill(server.pid, signal.SIGSTOP)
    thread = threading.Thread(target=attempt)
    thread.start()
    try:
        wait_until(lambda: outcome, 10, "the acquisition to give up")
    finally:
        os.kill(server.pid, signal.SIGCONT)
    thread.join(10)
    return outcome


@pytest.mark.parametrize(("api", "fencing"), [("sync", False), ("async", False), ("sync", True)])
def test_an_acquisition_that_gave_up_on_a_busy_redis_gives_the_lease_back(
    settings, redis_server_factory, redis_client, api, fencing
):
    """Redis busy for 1.5 s (a slow command, a fork) still runs the ACQUIRE after the caller
    gave up at its 1 s reply budget: the lease it grants must not stay taken by nobody. (A
    fenced acquisition's take.lua too: found by the simulation, tests/simulation/.)"""
    server = redis_server_factory()
    settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=30)
    # A pooled connection, as in a running process (and take.lua loaded, for a fenced one).
    Lock("warm-up", timeout=1, fencing=fencing).acquire()
    outcome = _given_up_on_a_stopped_server(server, api, Lock("busy", timeout=30, fencing=fencing))
    assert "did not answer" in str(outcome["error"])
    client = redis.Redis.from_url(server.url)
    assert not client.exists(lease_key("busy"))  # given back, after Redis ran the ACQUIRE
    client.close()


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_group_whose_release_failed_is_taken_again_after_finishing_it(
    behind_proxy, redis_client, reentrant
):
    """A member's failed release is finished before the group takes it again: the one-script
    path must not re-enter (or refuse) a hold whose release is under way."""
    from django_redis_lock import lock_many

    redis_proxy = behind_proxy(0.5)
    group = lock_many(["group:a", "group:b"], timeout=10, reentrant=reentrant)
    assert group.acquire()
    redis_proxy.mode = DROP_REPLIES
    with pytest.raises(LockBackendError):
        group.release()
    redis_proxy.mode = PASS
    assert group.acquire()
    for lock in group.locks:
        assert lease_token(redis_client, lease_key(lock.name)) == lock.token  # really held
    group.release()
    assert not redis_client.exists(lease_key("group:a"), lease_key("group:b"))


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_group_that_gave_up_on_a_busy_redis_gives_every_lease_back(
    settings, redis_server_factory, api
):
    """As above, for ``lock_many``'s one script that takes the free members together
    (take_many.lua): it runs after the caller gave up, and every lease it granted goes back
    right after it, on its connection. Found by the runtime simulation
    (tests/simulation/runtime/): they were held by nobody for a whole lease."""
    server = redis_server_factory()
    settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=30)
    lock_many(["warm-a", "warm-b"], timeout=1).acquire()  # (take_many.lua loaded)
    group = lock_many(["busy-group:a", "busy-group:b"], timeout=30)
    outcome = _given_up_on_a_stopped_server(server, api, group)
    assert "did not answer" in str(outcome["error"])
    client = redis.Redis.from_url(server.url)
    assert client.ping()  # (what was sent before has run)
    assert not client.exists(lease_key("busy-group:a"), lease_key("busy-group:b"))
    client.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_broken_connection_keeps_no_later_give_back_from_being_sent(redis_client, flavour):
    """Where commands cannot share a round trip (a Cluster's, a quorum's ``send_many``: each
    give-back of a group, each wake-up, to its own node), one whose connection broke does not
    keep the next from being sent: the error is raised once all were tried."""
    down = redis.Redis(port=free_port(), socket_connect_timeout=1)
    clients = {"down": down, "up": redis_client}
    commands = [("down", "SET", "drl:one-by-one:a", "1", "PX", 60_000),
                ("up", "SET", "drl:one-by-one:b", "1", "PX", 60_000)]  # fmt: skip
    if flavour == "sync":

        def send(where, *args):
            return clients[where].execute_command(*args)

        with pytest.raises(redis.ConnectionError):
            one_by_one(send, commands)
    else:
        where = redis_client.connection_pool.connection_kwargs
        up = redis.asyncio.Redis(host=where["host"], port=where["port"], db=where.get("db", 0))
        down_async = redis.asyncio.Redis(port=down.connection_pool.connection_kwargs["port"])

        async def asend(where, *args):
            return await {"down": down_async, "up": up}[where].execute_command(*args)

        async def both():
            try:
                await aone_by_one(asend, commands)
            finally:
                await up.aclose()
                await down_async.aclose()

        with pytest.raises(redis.ConnectionError):
            run(both())
    assert redis_client.get("drl:one-by-one:b") == b"1"
