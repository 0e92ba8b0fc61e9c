"""The watchdog's schedule (``core/renewal.py``) on a clock of plain numbers: when leases fall
due, how they are batched, what each result of a renewal means. No Redis and no waiting: the
renewals themselves, against a real server, are in locks/test_lock.py and
locks/test_lost_replies.py."""

from __future__ import annotations

import pytest

from django_redis_lock.core.durations import clock_allowance
from django_redis_lock.core.renewal import RETRY_INTERVAL, RenewedLease, Schedule

ONE, OTHER = object(), object()  # two Redis clients


def held(schedule, at, *, client=ONE, lease=3.0, **options):
    renewed = RenewedLease(client, f"k{len(schedule.leases)}", "t", lease, print, **options)
    renewed.confirmed(at)
    schedule.add(renewed)
    return renewed


def test_a_lease_falls_due_at_a_third_of_its_length():
    schedule = Schedule()
    lease = held(schedule, at=10.0)
    assert schedule.next_look() == 11.0
    assert schedule.look(10.4).batches == {}  # 11.0 is more than a sixth (0.5 s) away
    assert schedule.look(11.0).batches == {id(ONE): [lease]}


def test_leases_due_within_a_sixth_of_their_length_join_the_batch():
    schedule = Schedule()
    first = held(schedule, at=0.0)  # due 1.0
    near = held(schedule, at=0.4)  # due 1.4: within 0.5 of 1.0
    far = held(schedule, at=0.6)  # due 1.6: not
    other = held(schedule, at=0.0, client=OTHER)
    found = schedule.look(1.0)
    assert found.batches == {id(ONE): [first, near], id(OTHER): [other]}
    assert schedule.busy == {id(ONE), id(OTHER)}
    # A client's batch under way: its other leases wait, and are looked at when they could end.
    assert schedule.look(1.6).batches == {}
    assert schedule.next_look() == first.ends_at() == 3.0 - clock_allowance(3.0)
    assert far.due == 1.6
    assert far.ends_at() > first.ends_at()


def test_a_lease_that_ends_while_its_clients_batch_is_under_way_is_lost():
    schedule = Schedule()
    lease = held(schedule, at=0.0)
    schedule.look(1.0)  # its batch is sent, and Redis does not answer
    assert schedule.look(lease.ends_at() - 0.001).ended == []
    found = schedule.look(lease.ends_at())
    assert found.ended == [lease]
    assert lease not in schedule.leases.values()
    assert not lease.active
    assert "did not answer" in lease.unrenewed()


def test_a_renewed_lease_runs_from_when_the_renewal_was_sent():
    schedule = Schedule()
    lease = held(schedule, at=0.0)
    (batch,) = schedule.look(1.0).batches.values()
    lost, retried = schedule.finished(id(ONE), batch, [1], [3000], sent_at=1.0, now=1.2)
    assert (lost, retried) == ([], [])
    assert (lease.expires_at, lease.due) == (4.0, 2.0)
    assert schedule.busy == set()


def test_a_failed_renewal_is_retried_on_its_own_until_the_lease_would_end():
    schedule = Schedule()
    lease = held(schedule, at=0.0)
    schedule.look(1.0)
    lost, retried = schedule.finished(
        id(ONE), [lease], [ConnectionError("refused")], [3000], sent_at=1.0, now=1.0
    )
    assert (lost, retried) == ([], [lease])
    assert lease.due == 1.0 + RETRY_INTERVAL
    # Closer to the end, sooner: a quarter of what is left.
    schedule.look(lease.due)
    schedule.finished(id(ONE), [lease], [ConnectionError("refused")], [3000], 1.5, now=2.8)
    assert lease.due == pytest.approx(2.8 + 0.2 / 4)
    # A failing lease is retried when it is due, not early with a batch that goes sooner.
    neighbour = held(schedule, at=0.0)
    neighbour.due = lease.due - 0.01
    assert schedule.look(neighbour.due).batches == {id(ONE): [neighbour]}
    schedule.finished(id(ONE), [neighbour], [1], [3000], neighbour.due, now=neighbour.due)
    assert schedule.look(lease.due).batches == {id(ONE): [lease]}
    # Failing still at its end: lost, saying why.
    lost, retried = schedule.finished(
        id(ONE), [lease], [ConnectionError("refused")], [3000], sent_at=2.85, now=3.0
    )
    assert lost == [(lease, "Redis could not be reached to renew it (refused)")]
    assert not lease.active


def test_a_lease_gone_from_redis_is_lost_and_a_released_one_ignored():
    schedule = Schedule()
    gone, released = held(schedule, at=0.0), held(schedule, at=0.0)
    (batch,) = schedule.look(1.0).batches.values()
    schedule.remove(released)  # released while its renewal was under way
    lost, _ = schedule.finished(id(ONE), batch, [0, 1], [3000, 3000], sent_at=1.0, now=1.1)
    assert lost == [(gone, "its lease was gone when renewing (expired or deleted)")]
    assert released.expires_at == 3.0  # untouched


def test_a_lease_handed_over_short_is_lengthened_once_to_its_end():
    schedule = Schedule()
    lease = RenewedLease(ONE, "k", "t", 60.0, print, until=60.0)
    lease.confirmed(0.0, 3.0)  # handed over with 3 s; its own lease is 60 s from 0.0
    schedule.add(lease)
    assert lease.due == 1.0
    (batch,) = schedule.look(1.0).batches.values()
    assert lease.milliseconds(1.0) == 59_000
    schedule.finished(id(ONE), batch, [1], [59_000], sent_at=1.0, now=1.1)
    assert not lease.active
    assert schedule.leases == {}


def test_abandoned_leases_leave_and_a_failing_check_renews_anyway():
    schedule = Schedule()
    abandoned = held(schedule, at=0.0, abandoned=lambda: "its Lock object is gone")
    unsure = held(schedule, at=0.0, abandoned=lambda: 1 / 0)
    found = schedule.look(1.0)
    assert found.abandoned == [(abandoned, "its Lock object is gone")]
    assert found.batches == {id(ONE): [unsure]}
    assert list(schedule.leases.values()) == [unsure]


def test_adding_counts_on_so_the_thread_can_tell_it_missed_one():
    schedule = Schedule()
    before = schedule.added
    held(schedule, at=0.0)
    assert schedule.added == before + 1
    assert schedule.next_look() == 1.0
    assert Schedule().next_look() is None


def test_a_renewal_sent_after_the_lease_ended_waits_for_redis_and_says_why_it_was_late():
    """The process was paused (SIGSTOP, a long GC, a frozen VM) past its lease: the renewal
    goes out late. Redis alone can say whether the lease is still ours; if not, the loss is
    this process's lateness, not Redis failing to answer."""
    schedule = Schedule()
    lease = held(schedule, at=0.0)
    resumed = lease.ends_at() + 2.5  # nothing of the process ran meanwhile
    [batch] = schedule.look(resumed).batches.values()
    assert batch == [lease]
    assert schedule.look(resumed + 0.001).ended == []  # its renewal is waited for
    lost, _ = schedule.finished(id(ONE), [lease], [0], [3000], resumed, resumed + 0.002)
    [(_, reason)] = lost
    assert reason.startswith("its lease ended before this process could renew it")
    assert "2.5s after the lease's end" in reason
    assert "did not answer" not in reason


def test_a_late_renewal_that_finds_the_lease_still_ours_keeps_it():
    schedule = Schedule()
    lease = held(schedule, at=0.0)
    resumed = lease.ends_at() + 0.5
    schedule.look(resumed)
    lost, _ = schedule.finished(id(ONE), [lease], [1], [3000], resumed, resumed + 0.002)
    assert lost == []
    assert lease.late == 0.0
    assert lease.expires_at == resumed + 3.0


def test_a_pause_while_a_renewal_is_under_way_lets_its_answer_decide():
    """The renewal went out in time, then the process stopped before reading the answer: the
    watchdog, waking long after it planned to, waits for that answer (a lease length at most)
    instead of calling the lease lost because nobody answered."""
    schedule = Schedule()
    lease = held(schedule, at=0.0)
    [batch] = schedule.look(1.0).batches.values()  # sent in time
    planned = schedule.next_look()
    assert planned == lease.ends_at()  # the thread plans to give up on the answer then...
    resumed = planned + 5.0  # ...and runs again only now
    assert schedule.look(resumed).ended == []
    assert schedule.next_look() == resumed + lease.length  # the answer is waited for that long
    lost, _ = schedule.finished(id(ONE), batch, [1], [3000], 1.0, resumed + 0.001)
    assert lost == []  # Redis renewed it in time: nothing was lost


def test_a_renewal_that_never_answers_after_a_pause_is_still_given_up():
    schedule = Schedule()
    lease = held(schedule, at=0.0)
    schedule.look(1.0)
    resumed = schedule.next_look() + 5.0
    schedule.look(resumed)
    assert schedule.look(resumed + lease.length).ended == [lease]


def test_a_look_on_time_still_gives_up_on_a_renewal_redis_does_not_answer():
    schedule = Schedule()
    lease = held(schedule, at=0.0)
    schedule.look(1.0)
    assert schedule.look(schedule.next_look() + 0.01).ended == [lease]
    assert "did not answer" in lease.unrenewed()
