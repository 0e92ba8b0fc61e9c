"""The watchdog: leases renewed while held, and losses made loud."""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import os
import signal
import threading
import time

import pytest
import redis

from django_redis_lock import (
    Lock,
    LockLost,
    LockNotOwned,
    aclose_async_redis_clients,
    lock_lost,
)
from django_redis_lock.backends import ServerBackend
from django_redis_lock.core.durations import clock_allowance
from django_redis_lock.primitives.background.renewal import renewer
from django_redis_lock.primitives.keys import lock_keys
from tests.conftest import django_redis_caches
from tests.support import workers
from tests.support.helpers import RENEWED_LEASE, hold_in_thread, renewed_after, wait_until


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


def test_work_longer_than_the_lease_keeps_the_lock(settings, redis_client, losses):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = RENEWED_LEASE
    with Lock("long-job") as held:
        # The work: until Redis confirmed a renewal after the first lease would have ended
        # (each renewal lengthens the lease only while it is ours: nobody else got in).
        renewed_after(held, time.monotonic() + RENEWED_LEASE)
        assert Lock("long-job", wait=0).acquire() is False
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
    with Lock("asked", timeout=RENEWED_LEASE, auto_renew=True) as held:
        renewed_after(held, time.monotonic() + RENEWED_LEASE)
        assert held.owned()


def test_deleted_lease_is_reported(settings, redis_client, losses, caplog):
    # (Its next renewal must be in time for the loss to be "gone", not "ended before this
    # process could renew it": a lease a loaded machine's watchdog keeps.)
    settings.DJANGO_REDIS_LOCK_TIMEOUT = RENEWED_LEASE
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
    with Lock("restart", timeout=30) as again:  # new acquisitions work on the restarted server
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
    # Not before the lease could have ended (by a Redis clock running up to 1 % fast): until
    # then the renewal kept retrying.
    assert time.monotonic() - acquired >= 0.6 - clock_allowance(0.6)
    assert "could not be reached" in losses[0][1]
    assert lock.lost


def test_released_locks_leave_the_watchdog(settings):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 5
    with Lock("done") as held:
        hold = held._book.hold()
        assert renewer.renewing(hold)
        assert hold.renewal is None  # deferred: released before the watchdog looks, never made
    assert not renewer.renewing(hold)
    with Lock("done") as held:
        hold = held._book.hold()
        # Held past the watchdog's next look (at most a second away, or a third of the lease):
        # its renewal is made then.
        wait_until(lambda: hold.renewal is not None, 5, "the watchdog to take the hold on")
        assert renewer.renewing(hold)
    assert not renewer.renewing(hold)
    assert hold.renewal not in renewer


def test_a_hold_ending_while_the_watchdog_takes_it_on_is_never_renewed(settings):
    """The two orders of a release and the watchdog's look at a hold whose renewal is deferred
    (Bookkeeping._grown_up and _stop_renewing take turns under one lock), forced step by step:
    whichever comes first, a released hold is not renewed."""
    lock = Lock("turns")
    # The watchdog's thread looks only while it holds its condition: holding it here, this
    # test is the only one to look.
    with renewer._condition:
        for release_first in (True, False):
            lock.acquire()
            hold = lock._book.hold()
            grow, args = renewer.young[id(hold)]
            if release_first:
                lock.release()
                grow(*args)  # the look, after the release: finds nothing to take on
                assert hold.renewal is None
            else:
                grow(*args)
                assert hold.renewal in renewer
                lock.release()
                assert hold.renewal not in renewer
            assert not renewer.renewing(hold)


def _handed(name: str, redis_client) -> Lock:
    """``Lock(name, timeout=10)`` taken by this thread by a direct handoff, with the short
    lease a release hands a waiter (release.lua): another thread held it, and released it once
    this one was queued. Call with the watchdog's condition held: its look is the test's."""
    keys = lock_keys(name, "default")
    release, thread = hold_in_thread(name, timeout=10)
    lock = Lock(name, timeout=10, wait=10)
    threading.Timer(0, lambda: (
        wait_until(lambda: redis_client.llen(keys.queue) == 1, 10, "this thread to queue"),
        release.set(),
    )).start()  # fmt: skip
    assert lock.acquire()
    thread.join(10)
    assert 0 < redis_client.pttl(keys.lease) <= 3000  # handed short: HANDOFF_MS at most
    return lock


@pytest.mark.parametrize("extend_first", [False, True])
def test_a_handed_lease_is_lengthened_at_the_watchdogs_look_unless_extended(
    redis_client, extend_first
):
    """A lease handed over short is lengthened to the lock's whole lease once, and only if
    the hold outlives the watchdog's next look; an ``extend()`` sets its length instead, and is
    never undone by that lengthening, whichever comes first."""
    name = f"handed-{extend_first}"
    lease = lock_keys(name, "default").lease
    with renewer._condition:
        lock = _handed(name, redis_client)
        hold = lock._book.hold()
        assert hold.renewal is None  # deferred, not made yet
        assert renewer.renewing(hold)
        grow, args = renewer.young[id(hold)]
        if extend_first:
            lock.extend(60)
            grow(*args)  # the look: the extension set the length, nothing to lengthen
        else:
            grow(*args)
            assert hold.renewal in renewer
            assert hold.renewal.until is not None  # lengthened once, not renewed
            lock.extend(60)
        assert hold.renewal is None
        assert not renewer.renewing(hold)
        assert redis_client.pttl(lease) > 50_000
        lock.release()


def test_an_unexpected_error_is_a_failed_renewal_not_a_spinning_thread(
    settings, monkeypatch, losses
):
    """Not every client error is a RedisError (redis-py's RedisClusterException is not): it
    counts as a renewal that did not happen, retried (more often as the lease runs out), and
    the lock is reported lost when its lease would have ended."""
    calls = []

    def broken(backend, leases, lengths):  # a backend's renew()
        calls.append(time.monotonic())
        raise RuntimeError("not a RedisError")

    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    held = Lock("unexpected-error")
    held.acquire()
    monkeypatch.setattr(ServerBackend, "renew", broken)
    assert losses.event.wait(3)
    assert held.lost
    assert losses == [("unexpected-error", losses[0][1])]
    assert "not a RedisError" in losses[0][1]
    assert len(calls) < 100  # retried, not spun on (a spinning thread makes thousands)


def test_a_stalled_server_holds_up_only_its_own_renewals(
    settings, redis_url, redis_server_factory, losses
):
    """Each Redis client's renewals run apart: while one server does not answer (each try
    waits out its 60 s socket timeout), a lock on another server, with a 2 s lease, is
    renewed on time. The stalled server's lock is reported lost when its lease ends, by our
    clock, without waiting for the socket timeout."""
    stalled = redis_server_factory()
    caches = django_redis_caches(redis_url)
    caches["stalled"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": stalled.url,
        "OPTIONS": {"SOCKET_TIMEOUT": 60},
    }
    settings.CACHES = caches
    settings.DJANGO_REDIS_LOCK_TIMEOUT = RENEWED_LEASE
    on_stalled = Lock("on-the-stalled-server", using="stalled")
    on_stalled.acquire()
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        with Lock("elsewhere") as elsewhere:
            assert losses.event.wait(30)  # the stalled one could not be renewed in time
            # Renewed after the loss and past a lease after it: its renewals did not wait for
            # the stalled server's (each try of which waits up to a minute).
            renewed_after(elsewhere, time.monotonic() + RENEWED_LEASE)
            assert elsewhere.owned()
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    assert [name for name, _ in losses] == ["on-the-stalled-server"]


# -- a lease nobody can release any more is not renewed for ever -----------------------------


def abandonment_warnings(caplog, name):
    return [
        record
        for record in caplog.records
        if record.levelno == logging.WARNING
        and "acquired and never released" in record.getMessage()
        and repr(name) in record.getMessage()
    ]


def test_renewal_stops_when_the_holding_thread_ended_without_releasing(
    settings, redis_client, losses, caplog
):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3  # (its end is waited for: no renewal may come)
    lock = Lock("orphan")  # still referenced here: only its thread is gone
    acquired = []
    thread = threading.Thread(target=lambda: acquired.append(lock.acquire()), name="forgetful")
    thread.start()
    thread.join()
    key = lock_keys("orphan", "default").lease
    assert acquired == [True]
    wait_until(lambda: not redis_client.exists(key), 10, "the orphaned lease to expire")
    [warning] = abandonment_warnings(caplog, "orphan")
    assert "forgetful" in warning.getMessage()
    assert losses == []  # not a loss: nobody was holding it any more
    assert Lock("orphan", wait=0).acquire()


def test_renewal_stops_after_the_lock_object_is_garbage_collected(
    settings, redis_client, losses, caplog
):
    """python-redis-lock's test_auto_renewal_stops_after_gc, on our Lock."""
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    lock = Lock("dropped")
    lock.acquire()
    del lock
    gc.collect()
    key = lock_keys("dropped", "default").lease
    wait_until(lambda: not redis_client.exists(key), 10, "the dropped lock's lease to expire")
    [warning] = abandonment_warnings(caplog, "dropped")
    assert warning.getMessage().startswith("Lock 'dropped' was acquired")
    assert "garbage-collected" in warning.getMessage()
    assert losses == []


def test_a_lock_collected_while_its_renewal_hangs_is_still_said_never_released(
    settings, redis_server_factory, losses, caplog
):
    """Its lease ends while its renewal is under way (the server stopped) and its object was
    garbage-collected meanwhile: nobody is left to be told of a loss, but the caller's mistake
    is still said, as it is when the watchdog finds the object gone before a renewal (under a
    loaded machine's scheduling, that was either, and the warning came or not)."""
    server = redis_server_factory()
    settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=30)
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 1
    lock = Lock("collected-while-renewing")
    assert lock.acquire()
    os.kill(server.pid, signal.SIGSTOP)
    try:
        # Its renewal goes out at a third of its lease, and hangs.
        wait_until(lambda: renewer.schedule.busy, 10, "the renewal to be under way")
        del lock
        gc.collect()
        wait_until(
            lambda: abandonment_warnings(caplog, "collected-while-renewing"), 10,
            "the never-released warning",
        )  # fmt: skip
        assert losses == []  # (nobody to tell)
    finally:
        os.kill(server.pid, signal.SIGCONT)


def test_renewal_stops_when_the_holding_task_ended_without_releasing(
    settings, redis_client, losses, caplog
):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    lock = Lock("orphan-task")

    async def main():
        task = asyncio.create_task(lock.aacquire(), name="forgetful-task")
        assert await task
        await aclose_async_redis_clients()

    asyncio.run(main())
    key = lock_keys("orphan-task", "default").lease
    wait_until(lambda: not redis_client.exists(key), 10, "the orphaned lease to expire")
    [warning] = abandonment_warnings(caplog, "orphan-task")
    assert "forgetful-task" in warning.getMessage()


def test_a_lock_held_by_a_living_thread_is_still_renewed(settings, redis_client, losses, caplog):
    """The other side: a lease that a living thread holds through a live object is kept."""
    settings.DJANGO_REDIS_LOCK_TIMEOUT = RENEWED_LEASE
    held = Lock("kept")
    held.acquire()
    renewed_after(held, time.monotonic() + RENEWED_LEASE)  # past its first lease
    assert held.owned()
    assert abandonment_warnings(caplog, "kept") == []
    held.release()


# -- a stalled Redis: the holder learns at its lease's end, by its own clock -----------------


@pytest.mark.parametrize("stall", ["SIGSTOP", "CLIENT PAUSE"])
def test_a_loss_is_reported_when_the_lease_ends_even_while_the_renewal_hangs(
    settings, redis_server_factory, losses, stall
):
    """Before: the loss came after the renewal's socket timeout (5 s by default, here 30 s),
    long after the lease had ended and someone else could hold the lock."""
    server = redis_server_factory()
    settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=30)
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 1
    lock = Lock("frozen")
    sent = time.monotonic()  # the lease cannot end sooner than a lease after this
    lock.acquire()
    admin = redis.Redis.from_url(server.url)
    if stall == "SIGSTOP":
        os.kill(server.pid, signal.SIGSTOP)
    else:
        admin.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")  # scripts too
    try:
        assert losses.event.wait(10), "the loss was not reported at the lease's end"
        assert time.monotonic() - sent >= 1 - clock_allowance(1)  # not before it could end
        assert lock.lost
        assert losses == [("frozen", losses[0][1])]
        assert "did not answer" in losses[0][1]
    finally:
        if stall == "SIGSTOP":
            os.kill(server.pid, signal.SIGCONT)
        else:
            admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()


def test_a_holder_whose_process_was_paused_past_its_lease_is_told_it_was_late(redis_url):
    """SIGSTOP (a long GC, a frozen VM) for longer than the lease: on waking, the loss report
    says the lease ended before this process could renew it, not that Redis did not answer."""
    context = multiprocessing.get_context("spawn")
    ready, losses = context.Event(), context.Queue()
    holder = context.Process(
        target=workers.hold_and_report_losses, args=(redis_url, "paused", ready, losses)
    )
    holder.start()
    try:
        assert ready.wait(30)
        os.kill(holder.pid, signal.SIGSTOP)
        time.sleep(2.5)  # the fault itself: 2.5 s with no process, for a 1 s lease
        os.kill(holder.pid, signal.SIGCONT)
        reason = losses.get(timeout=30)
    finally:
        holder.kill()
        holder.join(10)
    assert reason.startswith("its lease ended before this process could renew it"), reason
    assert "paused" in reason
