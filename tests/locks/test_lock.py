"""The Lock API against a real redis-server, and one test per failure recipe (R1-R11)."""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from django.test import override_settings

from django_redis_lock import (
    Lock,
    LockBackendError,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    lock_acquired,
    lock_contended,
    lock_lost,
    lock_many,
    lock_not_acquired,
    lock_released,
)
from django_redis_lock.backends.scripts import RELEASE
from django_redis_lock.primitives import bookkeeping
from django_redis_lock.primitives.keys import lock_keys
from tests.conftest import django_redis_caches
from tests.support import workers
from tests.support.helpers import acquire_then_release, keys_left, read_lease, wait_until

SPAWN = multiprocessing.get_context("spawn")


def lease_key(name):
    return lock_keys(name, "default").lease


def in_thread(func, *args):
    """Run ``func`` in a real thread and return its result (re-raising its exception)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = func(*args)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


# -- the basics ------------------------------------------------------------------------------


def test_acquire_release(redis_client):
    lock = Lock("basic", timeout=10)
    assert not lock.locked()
    assert lock.ttl() is None
    assert lock.acquire() is True
    assert lock.locked()
    assert lock.owned()
    assert 9 < lock.ttl() <= 10
    assert len(lock.token) == 16  # the process id and 48 random bits, URL-safe base64
    lock.release()
    assert not lock.locked()
    assert lock.token is None
    assert keys_left(redis_client) == []  # nothing left behind


def test_with_block_gives_the_lock(redis_client):
    with Lock("ctx", timeout=10) as held:
        assert held.owned()
        assert redis_client.exists(lease_key("ctx"))
    assert not redis_client.exists(lease_key("ctx"))


def test_wait_zero_does_not_block():
    with Lock("busy", timeout=10):
        other = in_thread(lambda: Lock("busy", wait=0).acquire())
    assert other is False


def test_not_acquired_tells_who_holds_it():
    with Lock("held", timeout=10, label="nightly report"):

        def try_it():
            with Lock("held", wait=0):
                pass

        with pytest.raises(LockNotAcquired) as info:
            in_thread(try_it)
    error = info.value
    assert error.name == "held"
    assert error.owner["label"] == "nightly report"
    assert error.owner["pid"] == os.getpid()
    assert 0 < error.ttl <= 10
    assert abs(error.owner["acquired_at"] - time.time()) < 60  # server clock, epoch seconds
    assert "nightly report" in str(error)
    assert " since 20" in str(error)


def test_owner_record(redis_client):
    with Lock("rec", timeout=7, label="why|100%", fencing=True) as held:
        lease = read_lease(redis_client, lease_key("rec"))
        assert lease.token == held.token
        assert lease.fence == held.fencing_token > 0
    owner = lease.owner
    assert owner.name is None  # a readable name: the key shows it
    assert owner.label == "why|100%"
    assert owner.pid == os.getpid()
    assert owner.host
    assert owner.thread == threading.current_thread().name
    assert owner.lease == 7
    server_now_ms = redis_client.time()[0] * 1000
    assert abs(lease.since_ms - server_now_ms) < 5000  # a script wrote it: the server's clock


def test_lease_is_one_small_string(redis_client):
    with Lock("small", timeout=10):
        assert redis_client.type(lease_key("small")) == b"string"
        assert len(redis_client.get(lease_key("small"))) < 120
        # Uncontended, the lease is the lock's only key.
        assert redis_client.keys("*small*") == [lease_key("small").encode()]
    assert redis_client.keys("*small*") == []


def test_release_without_holding_raises_and_deletes_nothing(redis_client):
    holder = Lock("mine", timeout=10)
    holder.acquire()
    stranger = Lock("mine")
    with pytest.raises(LockNotOwned):
        stranger.release()
    assert holder.owned()
    holder.release()


def test_one_lock_object_shared_by_threads_keeps_owners_apart():
    shared = Lock("shared", timeout=10)
    assert shared.acquire()
    # Another thread can neither release our lease nor take the lock through the object.
    with pytest.raises(LockNotOwned):
        in_thread(shared.release)
    assert in_thread(lambda: shared.acquire(wait=0)) is False
    assert in_thread(lambda: shared.token) is None
    assert shared.owned()
    shared.release()


def test_non_reentrant_lock_refuses_to_reacquire_through_the_same_object():
    lock = Lock("once", timeout=10)
    with lock, pytest.raises(LockError, match="reentrant=True"):
        lock.acquire()


def test_a_thread_that_holds_the_lock_through_another_object_is_told_so():
    """Not "held by <host>/<pid>/MainThread", as if a stranger held it: this thread does, and
    a lock that is not re-entrant waits for it in vain."""
    with Lock("held-by-me", timeout=10), pytest.raises(LockNotAcquired) as refused:
        Lock("held-by-me", wait=0).claim().raise_unless_acquired()
    message = str(refused.value)
    assert "this thread holds it already, through another Lock object" in message
    assert "waits for itself" in message
    assert "reentrant=True" in message
    assert refused.value.owner["pid"] == os.getpid()  # the record is still there to read
    # Another thread waiting for it is told who holds it, as before.
    with Lock("held-by-me", timeout=10):
        other = in_thread(lambda: Lock("held-by-me", wait=0).claim().refusal)
    assert "this thread holds it" not in str(other)
    assert "held by" in str(other)


def test_reentrant_across_lock_objects(redis_client):
    outer = Lock("row:1", timeout=10, reentrant=True)
    inner = Lock("row:1", timeout=10, reentrant=True)
    with outer:
        lease = redis_client.get(lease_key("row:1"))
        with inner:
            assert inner.token == outer.token
            with outer:  # the same object again
                assert outer.owned()
            # Levels are counted in the process: the lease in Redis never changed.
            assert redis_client.get(lease_key("row:1")) == lease
        assert outer.owned()
        # Re-entry is per thread: another thread must wait.
        assert in_thread(lambda: Lock("row:1", reentrant=True, wait=0).acquire()) is False
    assert not redis_client.exists(lease_key("row:1"))


def test_reentrant_levels_released_out_of_order(redis_client):
    first = Lock("row:2", timeout=10, reentrant=True)
    second = Lock("row:2", timeout=10, reentrant=True)
    first.acquire()
    second.acquire()
    first.release()  # the outer level goes first; the owner still holds one level
    third = Lock("row:2", timeout=10, reentrant=True)
    assert third.acquire(wait=0)  # a re-entry, not a wait on ourselves
    assert third.token == second.token
    second.release()
    assert third.owned()  # one level left
    third.release()
    assert not redis_client.exists(lease_key("row:2"))


def test_a_reentrant_hold_whose_lease_ended_is_not_reentered(redis_client, monkeypatch):
    """A re-entry costs no round trip, so the hold's own lease end is what tells: past it (not
    renewed), another process may hold the lock, and a level more would guard nothing."""
    first = Lock("row:ended", timeout=30, reentrant=True)
    assert first.acquire()
    # 31 s later, by the holds' clock; the server's lease ran out meanwhile.
    monkeypatch.setattr(bookkeeping, "lease_clock", lambda: time.monotonic() + 31)
    redis_client.delete(lease_key("row:ended"))
    with pytest.raises(LockLost, match="ended before it was re-entered"):
        Lock("row:ended", reentrant=True).acquire()
    assert first.lost
    with pytest.raises(LockLost, match="ended before it was re-entered"):
        first.acquire()  # the same object again: the same answer
    with pytest.raises(LockNotOwned):
        first.release()  # the outer level finds the lease gone, and forgets the hold
    with Lock("row:ended", timeout=30, reentrant=True) as fresh:  # a lease of its own
        assert fresh.token != first.token
        assert read_lease(redis_client, lease_key("row:ended")).token == fresh.token


def test_a_hold_whose_lock_object_is_gone_is_not_reentered(redis_client):
    """Nobody can release a hold whose Lock object was collected: a re-entry through a new
    object would hold nothing. It takes a lease of its own (here: the old one ran out)."""
    abandoned = Lock("row:abandoned", timeout=30, reentrant=True)
    assert abandoned.acquire()
    token = abandoned.token
    del abandoned
    gc.collect()
    redis_client.delete(lease_key("row:abandoned"))  # its lease ran out
    with Lock("row:abandoned", timeout=30, reentrant=True) as fresh:
        assert fresh.token != token
        assert read_lease(redis_client, lease_key("row:abandoned")).token == fresh.token
    with lock_many(["row:abandoned", "row:other"], timeout=30, reentrant=True) as group:
        assert all(redis_client.exists(lease_key(name)) for name in group.names)


def test_extend(redis_client):
    with Lock("ext", timeout=2) as held:
        held.extend(30)
        assert 29 < held.ttl() <= 30
        held.extend()
        assert held.ttl() <= 2
    with pytest.raises(LockNotOwned):
        held.extend()


def test_fencing_tokens_strictly_increase(redis_client):
    tokens = []
    for _ in range(20):
        with Lock("fenced", timeout=10, fencing=True) as held:
            tokens.append(held.fencing_token)
        assert redis_client.keys("*fenced*") == []  # nothing is kept after a release
    assert tokens == sorted(set(tokens))
    assert all(isinstance(token, int) for token in tokens)


def test_fencing_tokens_increase_across_an_empty_restart(redis_server_factory):
    """A Redis without persistence restarts empty: the next holder's token is still larger
    (tokens come from the server's clock), so a stale holder's fenced writes stay refused."""
    server = redis_server_factory()
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url}}
    with override_settings(CACHES=caches):
        with Lock("fenced", timeout=10, fencing=True) as held:
            before = held.fencing_token
        server.restart()
        with Lock("fenced", timeout=10, fencing=True) as held:
            after = held.fencing_token
    assert after > before


def test_without_fencing_there_is_no_token(redis_client):
    with Lock("plain", timeout=10) as held:
        assert held.fencing_token is None
        assert read_lease(redis_client, lease_key("plain")).fence == 0


def test_signals(redis_client):
    seen = []

    def record(signal, **kwargs):
        seen.append((signal, kwargs["name"]))

    for sig in (lock_acquired, lock_released, lock_contended):
        sig.connect(record, weak=False)
    try:
        holder = Lock("sig", timeout=10)
        holder.acquire()
        waiting = threading.Thread(target=lambda: acquire_then_release(Lock("sig", wait=10)))
        waiting.start()
        wait_until(lambda: (lock_contended, "sig") in seen, what="the waiter to queue")
        holder.release()
        waiting.join()
    finally:
        for sig in (lock_acquired, lock_released, lock_contended):
            sig.disconnect(record)
    assert seen.count((lock_acquired, "sig")) == 2
    assert seen.count((lock_released, "sig")) == 2
    assert seen.count((lock_contended, "sig")) == 1


def test_lock_not_acquired_says_how_an_acquisition_ended_without_the_lock(settings, redis_client):
    seen = []

    def record(signal, **kwargs):
        seen.append((kwargs["name"], kwargs["outcome"], kwargs["waited"]))

    lock_not_acquired.connect(record, weak=False)
    try:
        with Lock("nsig:held", timeout=10):
            assert not Lock("nsig:held").acquire(wait=0.05)
        done = Lock("nsig:done")
        done.acquire()
        done.release(result=b"kept", result_ttl=10)
        assert Lock("nsig:done").claim(want_result=True).result == b"kept"
        settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")
        with pytest.raises(LockBackendError):
            Lock("nsig:down", wait=0).acquire()
    finally:
        lock_not_acquired.disconnect(record)
    assert [(name, outcome) for name, outcome, _ in seen] == [
        ("nsig:held", "timed_out"), ("nsig:done", "done"), ("nsig:down", "error"),
    ]  # fmt: skip
    assert seen[0][2] == 0.05  # the wait it was given


def test_script_flush_is_survived(redis_client):
    with Lock("flush", timeout=10):
        pass
    redis_client.script_flush()
    assert redis_client.script_exists(RELEASE.sha) == [False]
    with Lock("flush", timeout=10) as held:  # NOSCRIPT: loaded again, and the call retried
        assert held.owned()
    assert not redis_client.exists(lease_key("flush"))
    assert redis_client.script_exists(RELEASE.sha) == [True]


def test_unreachable_redis_is_a_backend_error(settings):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")
    with pytest.raises(LockBackendError, match="ConnectionError"):
        Lock("down", timeout=1).acquire()


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": None}, TypeError),
        ({"name": b"bytes"}, TypeError),
        ({"name": 42}, TypeError),
        ({"name": ""}, ValueError),
        ({"timeout": 0}, ValueError),
        ({"timeout": -1}, ValueError),
        ({"timeout": math.nan}, ValueError),
        ({"timeout": math.inf}, ValueError),
        ({"timeout": "10"}, TypeError),
        ({"timeout": True}, TypeError),
        ({"wait": -1}, ValueError),
        ({"wait": math.nan}, ValueError),
        ({"wait": "5"}, TypeError),
        ({"reentrant": 1}, TypeError),
        ({"fencing": "yes"}, TypeError),
        ({"auto_renew": 0}, TypeError),
        ({"label": 5}, TypeError),
        ({"using": ""}, TypeError),
    ],
)
def test_bad_arguments_fail_before_touching_redis(settings, kwargs, error):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")  # nothing listens there
    kwargs = {"name": "x", **kwargs}
    with pytest.raises(error):
        Lock(kwargs.pop("name"), **kwargs)


@pytest.mark.parametrize(
    ("wait", "error"), [(-1, ValueError), (math.nan, ValueError), ("1", TypeError)]
)
def test_bad_wait_for_acquire(settings, wait, error):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")
    with pytest.raises(error):
        Lock("x").acquire(wait=wait)


def test_infinite_wait_is_allowed_per_lock(settings):
    """wait=inf outlasts the default wait (here 0.1 s): it takes the lock when it is freed."""
    settings.DJANGO_REDIS_LOCK_WAIT = 0.1
    holder = Lock("patient", timeout=30)
    holder.acquire()
    queued = threading.Event()
    lock_contended.connect(lambda **kwargs: queued.set(), weak=False, dispatch_uid="patient")
    try:
        waiter = ThreadPoolExecutor(1).submit(Lock("patient", wait=math.inf, timeout=5).acquire)
        assert queued.wait(10)
        assert not waiter.done()
        time.sleep(0.3)  # three default waits
        assert not waiter.done()  # still waiting, not given up
        holder.release()
        assert waiter.result(10) is True
    finally:
        lock_contended.disconnect(dispatch_uid="patient")


# -- the recipes of lock-recipes.md ----------------------------------------------------------


def test_r1_crashed_holder_frees_the_lock_within_its_lease(redis_url):
    ready = SPAWN.Event()
    holder = SPAWN.Process(
        target=workers.hold_until_killed, args=(redis_url, "r1", ready), daemon=True
    )
    holder.start()
    assert ready.wait(30)
    assert Lock("r1", wait=0).acquire() is False
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    # The holder's lease was DJANGO_REDIS_LOCK_TIMEOUT = 1 s (renewed while it lived).
    waiter = Lock("r1", timeout=5)
    assert waiter.acquire(wait=1 + 2), "a dead holder kept the lock past its lease"
    waiter.release()


def test_r2_acquire_always_sets_ttl(redis_client):
    options = [
        {},
        {"timeout": 5},  # a fixed lease, not renewed
        {"timeout": 100, "auto_renew": True},
        {"reentrant": True},
        {"fencing": True},
    ]
    for kwargs in options:
        lock = Lock("r2", **kwargs)
        for _ in range(20):
            assert lock.acquire()
            assert redis_client.pttl(lease_key("r2")) > 0
            lock.release()
    # No key of ours ever lives without a TTL, the waiters' keys included.
    with Lock("r2", timeout=5, fencing=True):
        successor = Lock("r2", timeout=5, wait=math.inf)
        waiter = threading.Thread(target=acquire_then_release, args=(successor,))
        waiter.start()
        queue = lease_key("r2") + ":q"
        wait_until(lambda: redis_client.exists(queue), 10, "the waiter to queue")
        keys = {key.decode() for key in redis_client.scan_iter("lock:*")}
        assert {lease_key("r2"), queue, lease_key("r2") + ":d"} <= keys
        for key in keys:
            assert redis_client.pttl(key) > 0, key
    waiter.join(10)


def test_r3_failed_attempts_never_extend_the_holders_lease(redis_client):
    holder = Lock("r3", timeout=3)
    holder.acquire()
    key = lease_key("r3")
    previous = redis_client.pttl(key)
    for _ in range(100):
        assert Lock("r3", wait=0).acquire() is False
        Lock("r3", wait=0.001).acquire()  # a queued (waiting) attempt too
        current = redis_client.pttl(key)
        assert 0 < current <= previous
        previous = current
    holder.release()


def test_r4_client_clocks_do_not_enter_the_protocol(monkeypatch):
    holder = Lock("r4", timeout=10)
    holder.acquire()
    # A client whose wall clock is a day ahead (or behind) still cannot take the lock...
    for skew in (86_400, -86_400):
        monkeypatch.setattr(time, "time", lambda skew=skew: 1_700_000_000 + skew)
        assert Lock("r4", wait=0).acquire() is False
    monkeypatch.undo()
    # ...and the holder's lease is untouched.
    assert holder.owned()
    assert holder.ttl() > 9
    holder.release()


def test_r5_expired_holder_cannot_release_the_next_holders_lock(redis_client):
    first = Lock("r5", timeout=0.1)
    first.acquire()
    second = Lock("r5", timeout=10)
    with ThreadPoolExecutor(max_workers=1) as other_process:  # one thread: one owner
        assert other_process.submit(second.acquire, 5).result()  # once the first lease ends
        with pytest.raises(LockNotOwned):
            first.release()
        assert other_process.submit(second.owned).result()
        assert redis_client.exists(lease_key("r5"))
        other_process.submit(second.release).result()


def test_r6_release_is_one_server_side_script(redis_url, redis_client):
    lock = Lock("r6", timeout=10)
    lock.acquire()
    monitor_client = redis.Redis.from_url(redis_url)
    commands = []
    with monitor_client.monitor() as monitor:
        lock.release()
        redis_client.ping()  # a marker: everything before it was the release
        for event in monitor.listen():
            if event["command"] == "PING":
                break
            commands.append((event["client_type"], event["command"].split()[0].upper()))
    monitor_client.close()
    from_client = [command for source, command in commands if source != "lua"]
    assert from_client == ["EVALSHA"], commands  # no GET-then-DEL from the client
    assert ("lua", "DEL") in commands  # the delete happened inside the script


def test_r7_waiters_block_instead_of_polling(redis_url, redis_client):
    holder = Lock("r7", timeout=10)
    holder.acquire()
    before = redis_client.info("commandstats")
    waiter_got_it = threading.Event()

    def wait_for_it():
        with Lock("r7", wait=10):
            waiter_got_it.set()

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    time.sleep(0.5)  # the holder's work: the waiter must stay quiet meanwhile
    holder.release()
    assert waiter_got_it.wait(10)
    waiter.join()
    after = redis_client.info("commandstats")

    def calls(stats, name):
        return stats.get(f"cmdstat_{name}", {}).get("calls", 0)

    sent = {name: calls(after, name) - calls(before, name) for name in ("evalsha", "blpop")}
    # Acquire (queued), block, acquire, release: a polling waiter would send hundreds.
    assert sent["blpop"] <= 2
    assert sent["evalsha"] <= 4


def test_r8_wait_is_honoured(redis_client):
    holder = Lock("r8", timeout=10)
    holder.acquire()

    def timed_attempt():
        started = time.monotonic()
        result = Lock("r8").acquire(wait=0.3)
        return result, time.monotonic() - started

    result, elapsed = in_thread(timed_attempt)
    assert result is False
    assert elapsed >= 0.3  # the whole wait...
    # ...and not the default one (10 s): a loaded machine's scheduling is far less than 5 s.
    # (Each block's length to the millisecond, not rounded up to whole seconds, is asserted on
    # a driven clock: engine/test_core_flows.py, and test_waits.py for what is sent.)
    assert elapsed < 0.3 + 5
    assert holder.owned()
    holder.release()
    assert not redis_client.exists(lock_keys("r8", "default").queue)  # the waiter left the line


def test_r9_lost_lease_is_never_silent(redis_client, caplog):
    lost = []
    lock_lost.connect(lambda **kwargs: lost.append(kwargs["name"]), weak=False, dispatch_uid="r9")
    try:
        with pytest.raises(LockLost), Lock("r9", timeout=0.2) as held:
            redis_client.delete(lease_key("r9"))  # expired, or deleted by someone
            assert held.locked() is False
    finally:
        lock_lost.disconnect(dispatch_uid="r9")
    assert lost == ["r9"]
    assert any(
        record.levelname == "ERROR" and "r9" in record.getMessage() for record in caplog.records
    )


def test_r10_locks_are_taken_on_the_primary(settings, redis_server_factory):
    primary = redis_server_factory()
    replica = redis_server_factory(args=["--replicaof", primary.host, str(primary.port)])
    settings.CACHES = django_redis_caches([primary.url, replica.url])
    with Lock("r10", timeout=10):
        assert redis.Redis.from_url(primary.url).exists(lease_key("r10"))


def test_r11_every_acquisition_has_its_own_random_token(redis_client):
    tokens = set()
    for _ in range(1000):
        with Lock("r11", timeout=10) as held:
            tokens.add(held.token)
            # the process id and 48 random bits, URL-safe base64: no "|" (the separator).
            assert re.fullmatch(r"[A-Za-z0-9_-]{16}", held.token)
    assert len(tokens) == 1000


# -- connections -----------------------------------------------------------------------------


def test_a_wait_longer_than_the_socket_timeout_does_not_time_out(settings, redis_url):
    settings.CACHES = django_redis_caches(redis_url, SOCKET_TIMEOUT=0.2)
    holder = Lock("long-wait", timeout=0.8)  # not released: the waiter gets it at expiry
    holder.acquire()
    waiter = Lock("long-wait", timeout=5)
    assert in_thread(lambda: waiter.acquire(wait=5))  # blocks > 0.2 s without TimeoutError


def test_failed_release_keeps_the_token_for_a_retry(settings, redis_server_factory):
    from django_redis_lock import LockBackendError

    # An append-only file written on every command: the lease survives a crash and restart.
    server = redis_server_factory(args=["--appendonly", "yes", "--appendfsync", "always"])
    settings.CACHES = django_redis_caches(server.url, SOCKET_CONNECT_TIMEOUT=0.5)
    lock = Lock("retry-release", timeout=30)
    lock.acquire()
    token = lock.token
    server.kill()
    with pytest.raises(LockBackendError):
        lock.release()
    assert lock.token == token  # kept: the release can be tried again
    server.start()
    lock.release()
    assert lock.token is None
    assert not redis.Redis.from_url(server.url).exists(lease_key("retry-release"))


def test_the_name_by_keyword_as_other_libraries_write_it(redis_client):
    with Lock(name="by-keyword", timeout=10) as held:
        assert held.name == "by-keyword"
        assert redis_client.exists(lease_key("by-keyword"))
    with pytest.raises(TypeError, match=r"'nmae'; it takes .*name="):
        Lock(nmae="typo")  # type: ignore[call-arg]
