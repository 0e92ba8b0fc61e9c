"""Row locks on models: LockableModelMixin, @locked_method, transactions, fenced writes."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
from django.db import connection, transaction

from django_redis_lock import (
    Lock,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    fenced_update,
    locked_method,
)
from django_redis_lock.primitives.keys import lock_keys
from tests.support import workers
from tests.testapp.models import Account

SPAWN = multiprocessing.get_context("spawn")


def is_held(name: str) -> bool:
    return Lock(name).locked()


@pytest.mark.django_db
def test_lock_name_and_options():
    account = Account.objects.create()
    lock = account.lock()
    assert lock.name == f"testapp.account:{account.pk}"
    assert account.lock("statement").name == f"testapp.account:{account.pk}:statement"
    with account.lock(timeout=5) as held, account.lock() as again:  # re-entrant by default
        assert again.token == held.token
    assert account.lock(reentrant=False, label="x").label == "x"


def test_unsaved_instance_cannot_be_locked():
    with pytest.raises(ValueError, match="save it"):
        Account().lock()


@pytest.mark.django_db
def test_locked_method_refreshes_the_row_first():
    account = Account.objects.create(balance=10)
    stale = Account.objects.get(pk=account.pk)
    Account.objects.filter(pk=account.pk).update(balance=100)  # committed by someone else
    stale.deposit(1)  # reloads under the lock, so it builds on 100, not on its stale 10
    assert Account.objects.get(pk=account.pk).balance == 101


@pytest.mark.django_db(transaction=True)
def test_nested_locked_methods_do_not_deadlock():
    account = Account.objects.create()
    account.deposit_twice(5)
    account.refresh_from_db()
    assert account.balance == 10
    assert not is_held(account.lock().name)


@pytest.mark.django_db
def test_busy_row_raises_not_acquired():
    account = Account.objects.create()
    held, release = threading.Event(), threading.Event()

    def hold():
        with account.lock("statement", timeout=10):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    try:
        with pytest.raises(LockNotAcquired):
            account.make_statement()
    finally:
        release.set()
        thread.join()
    assert account.make_statement() is True  # held while the method runs


def test_async_methods_are_refused():
    with pytest.raises(TypeError, match="async"):

        @locked_method()
        async def method(self):
            pass


@pytest.mark.django_db(transaction=True)
def test_six_processes_lose_no_update(redis_url):
    account = Account.objects.create()
    database = connection.settings_dict["NAME"]
    rounds = 200
    with SPAWN.Manager() as manager:
        start = manager.Event()
        with SPAWN.Pool(6) as pool:
            pending = [
                pool.apply_async(
                    workers.deposit_under_lock, (redis_url, database, account.pk, rounds, start)
                )
                for _ in range(6)
            ]
            start.set()
            done = sum(result.get(timeout=300) for result in pending)
    account.refresh_from_db()
    assert done == 6 * rounds
    assert account.balance == 6 * rounds


# -- transactions ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_lock_is_held_until_the_transaction_commits():
    account = Account.objects.create()
    name = account.lock().name
    with transaction.atomic():
        account.deposit(1)
        # The method returned, but its write is not committed: the next holder must wait.
        assert is_held(name)
    assert not is_held(name)  # released right after the commit
    assert Account.objects.get(pk=account.pk).balance == 1


@pytest.mark.django_db(transaction=True)
def test_rollback_releases_the_lock():
    account = Account.objects.create()
    name = account.lock().name
    with pytest.raises(RuntimeError), transaction.atomic():
        account.deposit(1)
        assert is_held(name)
        raise RuntimeError("abort the transaction")
    assert not is_held(name)
    assert Account.objects.get(pk=account.pk).balance == 0


@pytest.mark.django_db(transaction=True)
def test_savepoint_rollback_releases_the_lock():
    account = Account.objects.create()
    name = account.lock().name
    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint
                account.deposit(1)
                raise RuntimeError("undo the deposit only")
        except RuntimeError:
            pass
        # The deposit is rolled back: nothing of it can be read stale, so the lock is free.
        assert not is_held(name)
    assert Account.objects.get(pk=account.pk).balance == 0


@pytest.mark.django_db(transaction=True)
def test_without_a_transaction_the_lock_is_released_at_once():
    account = Account.objects.create()
    account.deposit(1)
    assert not is_held(account.lock().name)


# -- fenced writes ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_stale_holder_cannot_overwrite_newer_work(redis_client):
    account = Account.objects.create()
    rows = Account.objects.filter(pk=account.pk)
    paused = account.lock(fencing=True, timeout=10)
    paused.acquire()
    stale_token = paused.fencing_token
    # The first holder pauses past its lease; the lock is taken over and the row written.
    redis_client.delete(lock_keys(paused.name, "default").lease)
    # Another holder (a row's lock is re-entrant: in this thread it would re-enter the paused
    # hold, which cannot know its lease was deleted without asking Redis).
    with account.lock(fencing=True, reentrant=False) as newer:
        assert newer.fencing_token > stale_token
        assert fenced_update(rows, newer.fencing_token, balance=50) == 1
    assert fenced_update(rows, stale_token, balance=-1) == 0  # refused
    assert rows.get().balance == 50
    with pytest.raises(LockNotOwned):  # the paused holder wakes up: nothing left to release
        paused.release()


@pytest.mark.django_db
def test_fenced_update_needs_an_int_token():
    with pytest.raises(TypeError, match="fencing=True"):
        fenced_update(Account.objects.all(), None, balance=1)


@pytest.mark.django_db(transaction=True)
def test_a_lock_lost_during_the_method_is_raised(redis_client, settings):
    account = Account.objects.create()

    class Deleting(Account):
        class Meta:
            proxy = True
            app_label = "testapp"

        @locked_method(timeout=10)
        def work(self):
            redis_client.delete(lock_keys(self.get_lock_name(), "default").lease)

    with pytest.raises(LockLost, match="was lost"):
        Deleting.objects.get(pk=account.pk).work()


@pytest.mark.django_db(transaction=True)
def test_the_methods_own_error_wins_over_a_lost_lock(redis_client):
    account = Account.objects.create()

    class Failing(Account):
        class Meta:
            proxy = True
            app_label = "testapp"

        @locked_method(timeout=10)
        def work(self):
            redis_client.delete(lock_keys(self.get_lock_name(), "default").lease)
            raise KeyError("the method's own error")

    with pytest.raises(KeyError):
        Failing.objects.get(pk=account.pk).work()
