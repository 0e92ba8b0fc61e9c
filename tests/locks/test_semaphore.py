"""Semaphore against a real redis-server: limits, leases judged by the server's clock, FIFO
handoff, losses, and bad input."""

from __future__ import annotations

import gc
import logging
import pickle
import threading
import time

import pytest

from django_redis_lock import (
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    Semaphore,
    lock_acquired,
    lock_lost,
    lock_released,
)
from django_redis_lock.core.lease import decode_lease
from django_redis_lock.primitives.keys import permit_keys
from tests.support.helpers import (
    acquire_then_release,
    keys_left,
    keys_without_ttl,
    run_async,
    start_queued,
    wait_until,
)


def keys_of(name):
    return permit_keys(name, "default")


def in_threads(count, target):
    threads = [threading.Thread(target=target, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)


# -- the basics ------------------------------------------------------------------------------


def test_limit_holders_at_once_then_refused(redis_client):
    semaphores = [Semaphore("renders", limit=3, wait=0) for _ in range(4)]
    assert [s.acquire() for s in semaphores[:3]] == [True, True, True]
    assert semaphores[3].acquire() is False
    assert semaphores[0].available() == 0
    assert len(semaphores[0].holders()) == 3
    semaphores[1].release()
    assert semaphores[3].acquire() is True
    for semaphore in (semaphores[0], semaphores[2], semaphores[3]):
        semaphore.release()
    assert keys_left(redis_client) == []  # nothing left once idle


def test_with_block_and_refusal_names_a_holder(redis_client):
    first = Semaphore("api:partner", limit=1, label="sync partner")
    with first:
        assert first.owned()
        with pytest.raises(LockNotAcquired) as refused, Semaphore("api:partner", limit=1, wait=0):
            pass
    assert refused.value.owner["label"] == "sync partner"
    assert not first.owned()


def test_holders_show_owner_records(redis_client):
    semaphore = Semaphore("reports", limit=2, label="nightly")
    with semaphore:
        (permit,) = semaphore.holders()
        lease = decode_lease(permit.as_lease())
        assert permit.limit == 2
        assert lease.owner.label == "nightly"
        assert lease.token == semaphore.token
        assert semaphore.available() == 1


def test_one_permit_per_thread_per_object():
    semaphore = Semaphore("once", limit=5)
    with semaphore, pytest.raises(LockError, match="already held"):
        semaphore.acquire()


def test_double_release_never_inflates_the_count(redis_client):
    holder, other = Semaphore("count", limit=1), Semaphore("count", limit=1, wait=0)
    assert holder.acquire()
    holder.release()
    with pytest.raises(LockNotOwned):
        holder.release()
    assert other.acquire()
    assert not Semaphore("count", limit=1, wait=0).acquire()  # still one holder at most
    other.release()


def test_a_non_holder_cannot_release(redis_client):
    holder = Semaphore("mine", limit=1)
    assert holder.acquire()
    with pytest.raises(LockNotOwned):
        Semaphore("mine", limit=1).release()
    assert holder.owned()
    holder.release()


def test_every_key_expires_while_held_and_queued(redis_client):
    holder = Semaphore("expiring", limit=1, timeout=30)
    assert holder.acquire()
    successor = Semaphore("expiring", limit=1, wait=5)
    waiting = threading.Thread(target=acquire_then_release, args=(successor,))
    waiting.start()
    wait_until(lambda: redis_client.exists(keys_of("expiring").queue), 5, "a waiter queued")
    assert keys_without_ttl(redis_client) == []
    holder.release()
    waiting.join(10)


# -- leases ----------------------------------------------------------------------------------


def test_an_unreleased_permit_returns_when_its_lease_ends(redis_client):
    # A fixed lease (timeout given: not renewed) that its holder never gives back, as a dead
    # holder's: the waiter gets the permit when the lease ends, by the server's clock.
    keys = keys_of("crash")
    stuck = Semaphore("crash", limit=1, timeout=0.5)
    assert stuck.acquire()
    waiter = Semaphore("crash", limit=1, wait=10)
    assert waiter.acquire()
    assert redis_client.zrange(keys.holders, 0, -1) == [waiter.token.encode()]
    with pytest.raises(LockNotOwned):
        stuck.release()  # its lease had ended: it gives back nothing, the waiter keeps its own
    assert waiter.owned()
    waiter.release()


def test_renewed_while_held_and_loss_is_reported(redis_client, settings):
    lost = []

    def on_lost(sender, **kwargs):
        lost.append((sender, kwargs["reason"]))

    # (1 s: renewed a third of the way, with 0.67 s to spare on a loaded machine.)
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 1.0
    holders = keys_of("renewed").holders
    semaphore = Semaphore("renewed", limit=2)
    lock_lost.connect(on_lost)
    try:
        assert semaphore.acquire()
        score = redis_client.zscore(holders, semaphore.token)
        wait_until(lambda: redis_client.zscore(holders, semaphore.token) > score, 5, "renewal")
        redis_client.zrem(holders, semaphore.token)  # force-released behind its back
        # (The signal is sent after ``lost`` turns True, on the watchdog's thread: waited for.)
        wait_until(lambda: lost, 5, "the loss noticed by renewal, and signalled")
        assert semaphore.lost
        with pytest.raises(LockLost):
            semaphore.ensure_held()
        with pytest.raises(LockNotOwned):
            semaphore.release()
    finally:
        lock_lost.disconnect(on_lost)
    assert lost[0][0] is Semaphore
    assert "gone" in lost[0][1] or "ended" in lost[0][1]


def test_a_collected_semaphores_permit_is_no_longer_renewed(redis_client, settings, caplog):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    holders = keys_of("dropped").holders
    gc.collect()  # an earlier test's garbage warns now, not inside this test's records
    caplog.clear()
    semaphore = Semaphore("dropped", limit=2)
    assert semaphore.acquire()
    del semaphore
    gc.collect()
    wait_until(lambda: not redis_client.exists(holders), 10, "the dropped permit to expire")
    [warning] = [
        record
        for record in caplog.records
        if record.levelno == logging.WARNING and "never released" in record.getMessage()
    ]
    assert warning.getMessage().startswith("Semaphore 'dropped' was acquired")
    assert "garbage-collected" in warning.getMessage()


def test_a_client_clock_an_hour_ahead_changes_nothing(redis_client, monkeypatch):
    holder = Semaphore("clock", limit=1, timeout=5)
    assert holder.acquire()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    assert not Semaphore("clock", limit=1, wait=0).acquire()
    assert holder.owned()
    holder.release()
    other = Semaphore("clock", limit=1, wait=0)
    assert other.acquire()
    other.release()


# -- waiting ---------------------------------------------------------------------------------


def test_waiters_enter_in_the_order_they_queued(redis_client):
    keys = keys_of("fifo")
    holder = Semaphore("fifo", limit=1)
    assert holder.acquire()
    entered = []

    def waiter(index):
        with Semaphore("fifo", limit=1, wait=30):
            entered.append(index)

    threads = start_queued(5, waiter, redis_client, keys.queue)
    holder.release()
    for thread in threads:
        thread.join(30)
    assert entered == [0, 1, 2, 3, 4]


def test_several_permits_free_wake_several_waiters(redis_client):
    keys = keys_of("several")
    holders = [Semaphore("several", limit=3, timeout=0.4) for _ in range(3)]
    for holder in holders:
        assert holder.acquire()  # fixed leases, never released: as dead holders'
    entered = []

    def waiter(index):
        with Semaphore("several", limit=3, wait=30):
            entered.append(index)

    in_threads(3, waiter)
    assert sorted(entered) == [0, 1, 2]
    assert redis_client.exists(keys.queue) == 0


def test_never_more_than_limit_inside(redis_client):
    inside, most = [0], [0]
    guard = threading.Lock()

    def worker(index):
        for _ in range(20):
            with Semaphore("bounded", limit=3, wait=30):
                with guard:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.001)
                with guard:
                    inside[0] -= 1

    in_threads(8, worker)
    assert most[0] == 3


def test_limits_that_differ_are_warned_about(redis_client, caplog):
    old = Semaphore("deploy", limit=2)
    assert old.acquire()
    with caplog.at_level(logging.WARNING, logger="django_redis_lock"):
        new = Semaphore("deploy", limit=3)
        assert new.acquire()
    assert "different limits" in caplog.text
    new.release()
    old.release()


# -- async, signals, decorators --------------------------------------------------------------


def test_async_api(redis_client):
    async def main():
        first, second = Semaphore("aio", limit=1), Semaphore("aio", limit=1, wait=0)
        async with first:
            assert not await second.aacquire()
        assert await second.aacquire()
        await second.arelease()

    run_async(main())
    assert keys_left(redis_client) == []


def test_signals_are_sent_with_the_semaphore_as_sender():
    seen = []

    def receiver(sender, **kwargs):
        seen.append((sender, kwargs["name"]))

    lock_acquired.connect(receiver)
    lock_released.connect(receiver)
    try:
        with Semaphore("signalled", limit=2):
            pass
    finally:
        lock_acquired.disconnect(receiver)
        lock_released.disconnect(receiver)
    assert seen == [(Semaphore, "signalled"), (Semaphore, "signalled")]


def test_pickled_copy_is_unheld():
    semaphore = Semaphore("copied", limit=4, label="x")
    with semaphore:
        copy = pickle.loads(pickle.dumps(semaphore))
    assert copy.limit == 4
    assert copy.token is None


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"limit": 0}, ValueError),
        ({"limit": 10_001}, ValueError),
        ({"limit": 2.5}, TypeError),
        ({"limit": True}, TypeError),
        ({"limit": "3"}, TypeError),
        ({"limit": 2, "timeout": -1}, ValueError),
        ({"limit": 2, "label": 3}, TypeError),
        ({"limit": 2, "using": ["a", "b", "c"]}, NotImplementedError),
    ],
)
def test_bad_options_are_typed_errors(options, error):
    with pytest.raises(error):
        Semaphore("bad", **options)


def test_limit_is_required():
    with pytest.raises(TypeError):
        Semaphore("bad")  # type: ignore[call-arg]


def test_another_librarys_option_is_named():
    with pytest.raises(TypeError, match="Semaphore"):
        Semaphore("bad", limit=2, blocking_timeout=3)


def test_a_key_of_the_wrong_type_harms_nobody(redis_client, planted):
    keys = keys_of("typed")
    redis_client.set(keys.holders, "not ours")
    planted.add(keys.holders)
    with pytest.raises(LockError):
        Semaphore("typed", limit=2).acquire()
    assert redis_client.get(keys.holders) == b"not ours"
    assert keys_without_ttl(redis_client, exempt=[keys.holders]) == []


def test_decorator_holds_a_permit_per_call(redis_client):
    from django_redis_lock import semaphore

    inside = []

    @semaphore("render:{kind}", limit=1, wait=0)
    def render(kind):
        inside.append(Semaphore(f"render:{kind}", limit=1, wait=0).acquire())
        return kind

    assert render("pdf") == "pdf"
    assert inside == [False]  # the call held the only permit

    @semaphore("arender", limit=2)
    async def arender():
        return Semaphore("arender", limit=2).available()

    assert run_async(arender()) == 1
    with pytest.raises(TypeError, match="@semaphore"):
        semaphore("x", limit=2, blocking=True)
    with pytest.raises(ValueError, match="limit"):
        semaphore("x", limit=0)


def test_name_and_limit_by_keyword_or_position(redis_client):
    """As redis-py's and python-redis-lock's callers write (name=), and as threading.Semaphore
    takes its value (second, positionally)."""
    by_name = Semaphore(name="spelled", limit=1)
    by_position = Semaphore("spelled", 1)
    assert (by_name.name, by_name.limit) == (by_position.name, by_position.limit) == ("spelled", 1)
    assert by_name.acquire(wait=0)
    assert not by_position.acquire(wait=0)  # one and the same semaphore
    by_name.release()
    with pytest.raises(TypeError, match="positional"):
        Semaphore("spelled", 1, 5)  # the options stay keyword-only  # type: ignore[misc]
