"""Reservations (``task_guards/reservations.py``) and what job locks do with them, on the suite's
real Redis: a job's lock is reserved when it is queued and taken over when it runs; a finished
job's result answers its redelivered copies; ``detach()`` hands a lease on without a gap."""

from __future__ import annotations

import threading

import pytest

from django_redis_lock import Lock, LockNotOwned
from django_redis_lock.core.lease import OwnerRecord, reservation_token
from django_redis_lock.primitives.keys import lock_keys
from django_redis_lock.registry import locks as lock_registry
from django_redis_lock.task_guards import reservations
from tests.support.helpers import read_lease, wait_until

JOB = "7d2c9a0e-0c1b-4a8e-9b1f-3f1d5c7a9e21"


def lease_key(name):
    return lock_keys(name, "default").lease


def test_a_reservation_is_the_jobs_until_its_run_takes_it_over(redis_client):
    assert reservations.reserve(
        "task:sync:42", JOB, ttl=60, label="sync", guard="until_executed"
    ).reserved
    info = lock_registry.get_lock("task:sync:42")
    assert (info.job_id, info.queued, info.guard, info.label) == (
        JOB,
        True,
        "until_executed",
        "sync",
    )
    assert 59 < info.ttl <= 60  # a fixed lease: nobody renews a queued job's lock
    # Another job, and a plain lock, find it taken.
    other = reservations.reserve("task:sync:42", "another-job", ttl=60)
    assert not other.reserved
    assert other.holder.job_id == JOB
    assert other.holder.queued
    assert not Lock("task:sync:42", wait=0).acquire()
    assert not Lock("task:sync:42", wait=0, job_id="another-job").acquire()
    # The job's run takes it over as if it were free, in one step: no gap for a duplicate.
    run = Lock("task:sync:42", timeout=30, job_id=JOB, guard="until_executed")
    assert run.acquire(wait=0)
    info = lock_registry.get_lock("task:sync:42")
    assert info.job_id == JOB
    assert not info.queued
    assert info.token == run.token
    assert info.guard == "until_executed"
    run.release()
    assert lock_registry.get_lock("task:sync:42") is None


def test_a_job_reserving_again_takes_its_own_hold_back_to_the_queue():
    """A retry published from inside the run: the key stays the job's, queued again."""
    run = Lock("task:retry", timeout=30, job_id=JOB)
    assert run.acquire(wait=0)
    token = run.detach()  # the run hands its hold on: renewal stops, nothing is deleted
    assert lock_registry.get_lock("task:retry").token == token
    with pytest.raises(LockNotOwned):
        run.release()
    assert not reservations.reserve("task:retry", JOB, ttl=60).reserved  # a new job's: not over it
    assert reservations.reserve("task:retry", JOB, ttl=60, again=True).reserved
    assert lock_registry.get_lock("task:retry").queued
    again = Lock("task:retry", timeout=30, job_id=JOB)
    assert again.acquire(wait=0)
    again.release()


def test_a_run_does_not_take_over_another_run_of_its_job():
    """A redelivered copy (same job id) waits like anyone else for a hold of its job."""
    first = Lock("task:copy", timeout=30, job_id=JOB)
    assert first.acquire(wait=0)
    copy = Lock("task:copy", timeout=30, job_id=JOB)
    assert not copy.acquire(wait=0)
    first.release()


def test_cancel_ends_only_that_jobs_reservation():
    assert reservations.reserve("task:revoked", JOB, ttl=60).reserved
    assert not reservations.cancel("task:revoked", "another-job")
    assert reservations.cancel("task:revoked", JOB)
    assert lock_registry.get_lock("task:revoked") is None
    assert not reservations.cancel("task:revoked", JOB)
    # A running hold is not a reservation: cancel leaves it alone.
    run = Lock("task:revoked", timeout=30, job_id=JOB)
    assert run.acquire(wait=0)
    assert not reservations.cancel("task:revoked", JOB)
    run.release()


def test_a_pending_reservation_is_renamed_and_taken_over_by_the_run():
    pending = reservations.pending_job_id()
    assert reservations.reserve("task:pending", pending, ttl=60).reserved
    # The run may start before the enqueue learnt the job's id: it takes the pending one over.
    early = Lock("task:pending", timeout=30, job_id=JOB)
    assert early.acquire(wait=0)
    # ...and the rename then finds a hold, not the pending reservation: it leaves it alone.
    assert not reservations.rename("task:pending", pending, JOB, ttl=60)
    assert lock_registry.get_lock("task:pending").token == early.token
    early.release()
    # Nor does it write anything once the run has ended: the key stays free.
    assert not reservations.rename("task:pending", pending, JOB, ttl=60)
    assert lock_registry.get_lock("task:pending") is None
    # Renamed in time, it is the job's, and its run takes it over.
    assert reservations.reserve("task:pending", pending, ttl=60).reserved
    assert not reservations.reserve(
        "task:pending", JOB, ttl=60
    ).reserved  # a new job's: not over it
    assert reservations.rename("task:pending", pending, JOB, ttl=60)
    info = lock_registry.get_lock("task:pending")
    assert info.job_id == JOB
    assert info.queued
    assert not reservations.rename(
        "task:pending", pending, "another-job", ttl=60
    )  # gone: no longer
    assert reservations.cancel("task:pending", JOB)


def test_a_run_ends_a_pending_reservation_of_its_key():
    """until_executing: a run that starts before the rename ends the pending reservation."""
    pending = reservations.pending_job_id()
    assert reservations.reserve("task:pend-end", pending, ttl=60).reserved
    assert reservations.cancel("task:pend-end", JOB)
    assert lock_registry.get_lock("task:pend-end") is None
    assert not reservations.rename("task:pend-end", pending, JOB, ttl=60)
    # Another job's reservation (not pending) is not ended.
    assert reservations.reserve("task:pend-end", "another-job", ttl=60).reserved
    assert not reservations.cancel("task:pend-end", JOB)
    assert lock_registry.get_lock("task:pend-end").job_id == "another-job"


def test_a_finished_jobs_result_answers_its_copies_and_nobody_else():
    first = Lock("task:done", timeout=30, job_id=JOB)
    assert first.acquire(wait=0)
    first.release(result=JOB.encode(), result_ttl=60)
    copy = Lock("task:done", timeout=30, job_id=JOB)
    claim = copy.claim(wait=0, want_result=True)
    assert not claim.acquired
    assert claim.result == JOB.encode()
    other = Lock("task:done", timeout=30, job_id="another-job")
    claim = other.claim(wait=0, want_result=True)
    assert claim.acquired  # another job's result is not this one's
    other.release()


def test_a_finished_jobs_copy_is_answered_after_a_later_job_of_its_key_finished(redis_client):
    """Each job's record is its own: a later job of the same key (run and finished while the
    first one's copy waited in the broker) does not make the copy run the first job again."""
    first = Lock("task:later", timeout=30, job_id=JOB)
    assert first.acquire(wait=0)
    first.release(result=JOB.encode(), result_ttl=60)
    later = Lock("task:later", timeout=30, job_id="later-job")
    assert later.claim(wait=0, want_result=True).acquired
    later.release(result=b"later-job", result_ttl=60)
    copy = Lock("task:later", timeout=30, job_id=JOB)
    claim = copy.claim(wait=0, want_result=True)
    assert not claim.acquired
    assert claim.result == JOB.encode()
    # Each record ends: a key with an expiry, per job.
    for job in (JOB, "later-job"):
        key = lock_keys("task:later", "default").result_of(reservation_token(job))
        assert 0 < redis_client.pttl(key) <= 60_000


def test_a_copy_waiting_for_its_running_job_learns_that_it_finished():
    first = Lock("task:handoff", timeout=30, job_id=JOB)
    assert first.acquire(wait=0)
    claims = []
    copy = Lock("task:handoff", timeout=30, job_id=JOB)
    waiter = threading.Thread(target=lambda: claims.append(copy.claim(10, want_result=True)))
    waiter.start()
    wait_until(lambda: lock_registry.waiting("task:handoff") == 1, what="the copy to queue")
    first.release(result=JOB.encode(), result_ttl=60)  # hands the lock to the copy...
    waiter.join(10)
    assert not claims[0].acquired
    assert claims[0].result == JOB.encode()
    assert lock_registry.get_lock("task:handoff") is None


def test_a_guard_is_written_in_the_record_and_a_longer_record_is_still_read(redis_client):
    record = OwnerRecord(10, 1, "h", "t", guard="while_executing")
    assert OwnerRecord.decode(record.encode()).guard == "while_executing"
    assert OwnerRecord.decode(OwnerRecord(10, 1, "h", "t").encode()).guard is None
    # A newer version's record has more fields: read what we know of it.
    assert OwnerRecord.decode(record.encode() + "|later").guard == "while_executing"
    with Lock("plain", timeout=5):
        assert read_lease(redis_client, lease_key("plain")).owner.guard is None


@pytest.mark.parametrize("job_id", ["a~b", "pending~", "a\ud800"])
def test_job_ids_with_the_separator_or_no_utf8_are_refused(job_id):
    """A clear error, not a token or a key Redis cannot be sent (a lone surrogate)."""
    with pytest.raises(ValueError, match="'~' or lone surrogate"):
        reservations.reserve("x", job_id, ttl=1)
