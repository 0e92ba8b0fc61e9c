"""The watchdog: leases renewed while held, and losses made loud."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest

from django_redis_lock import Lock, LockLost, LockNotOwned, lock_lost
from django_redis_lock.keys import lock_keys
from django_redis_lock.renewal import renewer
from tests.conftest import django_redis_caches


@pytest.fixture
def losses():
    """Each lock_lost signal, as (name, reason); ``losses.event`` is set on the first."""

    class Losses(list):
        event = threading.Event()

    seen = Losses()

    def receiver(**kwargs):
        seen.append((kwargs["name"], kwargs["reason"]))
        seen.event.set()

    lock_lost.connect(receiver, weak=False, dispatch_uid="test-losses")
    yield seen
    lock_lost.disconnect(dispatch_uid="test-losses")


def test_work_three_times_longer_than_the_lease_keeps_the_lock(settings, redis_client, losses):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    with Lock("long-job") as held:
        deadline = time.monotonic() + 0.9  # the work: three leases long
        while time.monotonic() < deadline:
            assert Lock("long-job", wait=0).acquire() is False  # nobody else got in
            time.sleep(0.05)
        assert held.owned()
        assert not held.lost
    assert losses == []


def test_explicit_timeout_is_not_renewed(redis_client):
    lock = Lock("short", timeout=0.2)
    lock.acquire()
    # Without renewal the lease simply ends: another acquirer gets in when it does.
    other = Lock("short", timeout=5)
    other_got_it = threading.Event()
    thread = threading.Thread(target=lambda: other.acquire(wait=5) and other_got_it.set())
    thread.start()
    assert other_got_it.wait(5)
    thread.join()
    with pytest.raises(LockNotOwned):
        lock.release()


def test_auto_renew_can_be_asked_for_with_an_explicit_timeout(redis_client):
    with Lock("asked", timeout=0.3, auto_renew=True) as held:
        time.sleep(0.7)
        assert held.owned()


def test_deleted_lease_is_reported(settings, redis_client, losses, caplog):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    with pytest.raises(LockLost), Lock("victim", label="nightly") as held:
        redis_client.delete(lock_keys("victim", "default").lease)
        assert losses.event.wait(5), "the renewal did not notice"
        assert held.lost
        with pytest.raises(LockLost):
            held.ensure_held()
    assert losses == [("victim", "its lease was gone when renewing (expired or deleted)")]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors
    assert "victim" in errors[0].getMessage()


def test_ensure_held_asks_redis(redis_client, losses):
    with pytest.raises(LockLost), Lock("checked", timeout=10) as held:
        held.ensure_held()  # fine while held
        redis_client.delete(lock_keys("checked", "default").lease)
        held.ensure_held()
    assert [name for name, _ in losses] == ["checked"]


def test_redis_restart_while_held_is_a_loss_then_locking_works(
    settings, redis_server_factory, losses
):
    server = redis_server_factory()
    settings.CACHES = django_redis_caches(server.url)
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.5
    lock = Lock("restart")
    lock.acquire()
    server.restart()  # same port, empty memory
    assert losses.event.wait(5)
    assert lock.lost
    with pytest.raises(LockNotOwned):
        lock.release()
    with Lock("restart") as again:  # new acquisitions work on the restarted server
        assert again.owned()


def test_unreachable_redis_is_declared_a_loss_when_the_lease_would_end(
    settings, redis_server_factory, losses
):
    server = redis_server_factory()
    settings.CACHES = django_redis_caches(
        server.url, SOCKET_TIMEOUT=0.2, SOCKET_CONNECT_TIMEOUT=0.2
    )
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.6
    lock = Lock("unreachable")
    acquired = time.monotonic()  # the lease cannot end sooner than this plus its length
    lock.acquire()
    server.kill()
    assert losses.event.wait(10)
    # Not before the lease could have ended: until then the renewal kept retrying.
    assert time.monotonic() - acquired >= 0.6
    assert "could not be reached" in losses[0][1]
    assert lock.lost


def test_released_locks_leave_the_watchdog(settings):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 5
    with Lock("done") as held:
        hold = held._hold()
        assert hold.renewal in renewer
    assert hold.renewal not in renewer


def test_an_unexpected_error_is_a_failed_renewal_not_a_spinning_thread(
    settings, monkeypatch, losses
):
    """Not every client error is a RedisError (redis-py's RedisClusterException is not): it
    counts as a renewal that did not happen, retried (more often as the lease runs out), and
    the lock is reported lost when its lease would have ended."""
    calls = []

    def broken(client, leases):
        calls.append(time.monotonic())
        raise RuntimeError("not a RedisError")

    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    held = Lock("unexpected-error")
    held.acquire()
    monkeypatch.setattr(renewer, "_extend_all", broken)
    assert losses.event.wait(3)
    assert held.lost
    assert losses == [("unexpected-error", losses[0][1])]
    assert "not a RedisError" in losses[0][1]
    assert len(calls) < 100  # retried, not spun on (a spinning thread makes thousands)


def test_a_stalled_server_holds_up_only_its_own_renewals(
    settings, redis_url, redis_server_factory, losses
):
    """Each Redis client's renewals run apart: while one server does not answer (each try
    waits out its 2 s socket timeout), a lock on another server, with a 0.3 s lease, is
    renewed on time."""
    stalled = redis_server_factory()
    caches = django_redis_caches(redis_url)
    caches["stalled"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": stalled.url,
        "OPTIONS": {"SOCKET_TIMEOUT": 2},
    }
    settings.CACHES = caches
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    on_stalled = Lock("on-the-stalled-server", using="stalled")
    on_stalled.acquire()
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        with Lock("elsewhere") as elsewhere:
            assert not losses.event.wait(1.2)  # four leases: renewed all along
            assert elsewhere.owned()
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    assert losses.event.wait(5)  # the stalled one could not be renewed in time
    assert [name for name, _ in losses] == ["on-the-stalled-server"]
