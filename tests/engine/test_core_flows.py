"""The sans-I/O core on its own: flows driven by hand, with a fake clock and canned replies.

Where time is logic (deadlines, how long to block, when to give up) these tests decide it
exactly, with no Redis and no waiting; what only a server can show is tested elsewhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_redis_lock.core import flows
from django_redis_lock.core.lease import OwnerRecord, decode_lease, encode_lease, held_by
from django_redis_lock.core.requests import Block, Command, Eval, Pipeline, Sleep
from django_redis_lock.core.uncontended import LOST_RACE_RETRY_MS

KEYS = flows.LockKeys.of("lock:{job}")
RECORD = OwnerRecord(10, 42, "host", "MainThread", label="a|b%c").encode()
HOLDER = encode_lease("other", 1_700_000_000_000, 0, RECORD).encode()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plan(clock: Clock, **options: Any) -> flows.AcquirePlan:
    defaults: dict[str, Any] = {
        "keys": KEYS, "token": "tok", "lease_ms": 10_000, "record": RECORD, "max_wait": 5.0,
        "clock": clock, "started": clock.now,
    }  # fmt: skip
    defaults.update(options)
    return flows.AcquirePlan(**defaults)


def test_a_free_lock_is_one_bare_set():
    clock = Clock()
    flow = flows.acquire(plan(clock))
    request = next(flow)
    assert isinstance(request, Command)
    assert request.args[:2] == ("SET", KEYS.lease)
    assert request.args[3:] == ("NX", "PX", 10_000)
    assert held_by(request.args[2], "tok")
    assert request.give_back is not None
    assert request.give_back.script == "release"
    with pytest.raises(StopIteration) as done:
        flow.send(b"OK")
    assert done.value.value == flows.Acquired(0, 10_000, 100.0, "")


def test_not_waiting_reports_the_holder_in_one_more_round_trip():
    clock = Clock()
    flow = flows.acquire(plan(clock, max_wait=0))
    next(flow)
    request = flow.send(None)  # the SET found it held
    assert request == Pipeline((("GET", KEYS.lease), ("PTTL", KEYS.lease)))
    with pytest.raises(StopIteration) as done:
        flow.send([HOLDER, 4321])
    assert done.value.value == flows.NotAcquired(HOLDER, 4321)


def test_a_waiter_queues_and_blocks_in_one_round_trip_and_is_handed_the_lease():
    clock = Clock()
    contended = []
    flow = flows.acquire(plan(clock, on_contended=lambda plan, holder: contended.append(holder)))
    next(flow)
    clock.now += 0.001
    request = flow.send(None)  # held: join the queue
    assert isinstance(request, Block)
    assert request.key == KEYS.wake("tok")
    # The holder's lease is not known yet: at most our own lease, capped.
    assert request.seconds == flows.BLOCK_CAP
    assert not request.exact
    join = request.first
    assert isinstance(join, Eval)
    assert join.script == "join"
    assert join.keys == (KEYS.lease, KEYS.queue, KEYS.waiters, KEYS.wake("tok"), KEYS.result)
    assert join.args[3] == flows.QUEUE
    assert "b" in join.args[4]
    assert join.args[5] == int((flows.BLOCK_CAP + flows.LIVENESS_SLACK) * 1000)  # liveness
    clock.now += 0.5
    with pytest.raises(StopIteration) as done:
        flow.send(([0, 9000, HOLDER], b"1700000000000001|3000|0|next"))
    assert contended == [HOLDER]
    granted = done.value.value
    assert granted == flows.Acquired(1_700_000_000_000_001, 3000, 100.001, "next", False)


def test_a_block_ends_with_the_holders_lease_and_the_wait_ends_on_time():
    clock = Clock()
    flow = flows.acquire(plan(clock, max_wait=1.0, first="join"))
    request = next(flow)
    assert request.seconds == 1.0
    assert request.exact
    clock.now += 0.2
    request = flow.send(([0, 300, False], None))  # queued; the block timed out
    # Next block: until the holder's lease ends (300 ms), not the whole wait.
    assert request.seconds == pytest.approx(0.301)
    assert request.exact
    clock.now += 1.0  # the wait is over: a last try, which leaves the line if it is held
    request = flow.send(([0, 100, False], None))
    assert isinstance(request, Eval)
    assert request.args[3] == flows.TAKE_OR_LEAVE
    with pytest.raises(StopIteration) as done:
        flow.send([0, 50, HOLDER])
    assert done.value.value == flows.NotAcquired(HOLDER, 50)


def test_an_error_while_queued_steps_out_of_the_line_then_raises():
    clock = Clock()
    flow = flows.acquire(plan(clock, first="join"))
    next(flow)
    leave = flow.throw(ConnectionError("dropped"))
    assert isinstance(leave, Eval)
    assert leave.script == "join"
    assert leave.cleanup
    assert leave.args[3] == flows.LEAVE
    with pytest.raises(ConnectionError):
        flow.send([0, 0, False])


def test_a_lease_handed_to_a_waiter_that_was_leaving_is_passed_on():
    clock = Clock()
    flow = flows.acquire(plan(clock, first="join"))
    next(flow)
    flow.throw(KeyboardInterrupt())  # interrupted while blocked
    release = flow.send([1, "0", 3000, b"0|3000|0|"])  # handed to us meanwhile
    assert isinstance(release, Eval)
    assert release.script == "release"
    assert release.cleanup
    with pytest.raises(KeyboardInterrupt):
        flow.send([0])


def test_a_leave_whose_reply_is_not_read_gives_a_lease_handed_meanwhile_back_behind_it():
    """Interrupted again while its step out of the line waits for the reply, the waiter would
    never send the release that a "handed to you" reply asks for: the release rides behind
    the leave, on its connection (found by the runtime simulation)."""
    clock = Clock()
    flow = flows.acquire(plan(clock, first="join"))
    next(flow)
    leave = flow.throw(KeyboardInterrupt())
    assert leave.args[3] == flows.LEAVE
    assert leave.give_back is not None
    assert leave.give_back.script == "release"
    assert leave.give_back.args[0] == "tok"  # (ends only a lease that is ours)


def test_a_duplicate_handed_the_lock_after_the_work_passes_it_on_before_reading_the_result():
    """``want_result``: handed the lock with the work done, the waiter passes it on first and
    reads the result after: interrupted or cancelled while it reads, it holds nothing (found
    by the runtime simulation: the lock was held by nobody for a hand-off)."""
    clock = Clock()
    flow = flows.acquire(plan(clock, first="join", want_result=True))
    next(flow)
    release = flow.send(([0, 9000, HOLDER], b"1700000000000001|3000|1|next"))  # done: "1"
    assert isinstance(release, Eval)
    assert release.script == "release"
    assert release.cleanup
    assert release.args[0] == "tok"
    read = flow.send([0])  # released (nobody else waits)
    assert read == Command(("GET", KEYS.result))
    with pytest.raises(StopIteration) as done:
        flow.send(b"the result")
    assert done.value.value == flows.Done(b"the result")


def test_an_unreachable_redis_is_not_told_anything_more():
    clock = Clock()
    flow = flows.acquire(plan(clock, first="join", unreachable=lambda error: True))
    next(flow)
    with pytest.raises(TimeoutError):
        flow.throw(TimeoutError("no reply"))


def test_a_slot_being_moved_is_looked_at_again_until_the_wait_is_over():
    clock = Clock()
    flow = flows.acquire(plan(clock, max_wait=0.2, first="join", retry_soon=lambda e: True))
    next(flow)
    request = flow.throw(RuntimeError("TRYAGAIN"))
    assert isinstance(request, Sleep)
    assert 0 < request.seconds <= 0.2
    clock.now += 0.3
    request = flow.send(None)  # the next look: the wait is over, the lock was held
    assert isinstance(request, Eval)
    assert request.args[3] == flows.TAKE_OR_LEAVE
    with pytest.raises(StopIteration) as done:
        flow.throw(RuntimeError("TRYAGAIN"))
    assert isinstance(done.value.value, flows.NotAcquired)


def test_without_a_queue_a_waiter_polls_after_a_random_delay():
    clock = Clock()
    flow = flows.acquire(plan(clock, queues=False, first="take", max_wait=1.0))
    request = next(flow)
    assert isinstance(request, Eval)
    assert request.script == "take"
    assert request.keys == (KEYS.lease,)
    request = flow.send([0, 500, HOLDER])
    assert isinstance(request, Sleep)
    assert flows.RETRY_DELAY[0] <= request.seconds <= flows.RETRY_DELAY[1]
    with pytest.raises(StopIteration) as done:
        flow.send(None)  # slept; then granted
        flow.send([1, "7", 10_000, ""])
    assert done.value.value.fence == 7


def test_release_wakes_an_unexpected_first_waiter_itself():
    flow = flows.release(KEYS, "tok", "")
    request = next(flow)
    assert request.script == "release"
    assert request.keys == KEYS.release_keys("")
    push = flow.send([2, b"w2", b"0|3000|0|w3"])
    # (The push and its list's expiry in one script: never the one without the other.)
    assert push == Eval("wake", (KEYS.wake("w2"),), ("0|3000|0|w3", 3000), cleanup=True)
    with pytest.raises(StopIteration) as done:
        flow.send([1, 1])
    assert done.value.value == 0


def test_release_of_a_lease_that_is_not_ours():
    flow = flows.release(KEYS, "tok", "w2")
    request = next(flow)
    assert request.keys[3] == KEYS.wake("w2")  # the expected waiter's list: a declared key
    with pytest.raises(StopIteration) as done:
        flow.send([-1])
    assert done.value.value == -1


def test_the_lease_value_round_trips():
    lease = decode_lease(encode_lease("tok", 1_700_000_000_123, 55, RECORD))
    assert lease.token == "tok"
    assert lease.fence == 55
    assert lease.since_ms == 1_700_000_000_123
    assert lease.owner == OwnerRecord(10, 42, "host", "MainThread", label="a|b%c")
    assert lease.describe("job")["name"] == "job"
    with pytest.raises(ValueError, match="not a lease"):
        decode_lease(b"not a lease")


def test_a_block_sent_with_its_join_is_cut_when_the_holders_lease_ends_sooner():
    """The first block goes out before the holder's lease is known: the backend cuts it at the
    lease end the join reports (the holder may have died without releasing)."""
    clock = Clock()
    flow = flows.acquire(plan(clock, first="join"))
    request = next(flow)
    assert request.after_first([0, 120, False]) == pytest.approx(0.121)
    assert request.after_first([1, "0", 10_000, ""]) == float("inf")  # taken: nothing to cut


def test_a_lease_handed_short_is_counted_until_our_liveness_deadline_at_least():
    """A release hands a lease no longer than the waiter's liveness window (release.lua): it
    ran the release after our join, so the lease runs at least that long from our join's send,
    whatever the message says of how long was left when it was handed."""
    clock = Clock()
    flow = flows.acquire(plan(clock, first="join"))
    next(flow)
    clock.now += 1.9
    with pytest.raises(StopIteration) as done:
        flow.send(([0, 9000, False, 0], b"0|1100|0|"))
    liveness_ms = int((flows.BLOCK_CAP + flows.LIVENESS_SLACK) * 1000)
    assert done.value.value == flows.Acquired(0, liveness_ms, 100.0, "", False)


def test_a_waiter_looks_again_when_the_waiter_ahead_of_it_is_counted_dead():
    """A waiter that died ahead of us may be handed the lease, which then ends with its
    liveness: our next block ends by then (by the server's timer: not worth a new connection)."""
    clock = Clock()
    flow = flows.acquire(plan(clock, first="join"))
    first = next(flow)
    # Sent before anything was known, the first block is cut at that deadline by the backend.
    assert first.after_first([0, 9000, False, 700]) == pytest.approx(0.701)
    assert first.after_first([0, 9000, False, 0]) == pytest.approx(9.001)
    clock.now += 0.7
    request = flow.send(([0, 9000, False, 1200], None))  # queued behind a live waiter
    assert request.seconds == pytest.approx(0.501)
    assert not request.exact
    assert request.first.args[5] == int((0.501 + flows.LIVENESS_SLACK) * 1000)
    clock.now += 0.501
    request = flow.send(([0, 8000, False, 0], None))  # nobody alive ahead: the usual cap
    assert request.seconds == flows.BLOCK_CAP
    assert not request.exact


def test_a_waiter_is_reported_contended_as_soon_as_it_queues_not_after_its_block():
    clock = Clock()
    contended = []
    flow = flows.acquire(
        plan(clock, first="join", on_contended=lambda plan, holder: contended.append(holder))
    )
    request = next(flow)
    assert request.after_first([0, 9000, HOLDER, 0]) == pytest.approx(9.001)
    assert contended == [HOLDER]  # while the block still goes on
    request.after_first([0, 8000, HOLDER, 0])
    flow.send(([0, 8000, HOLDER, 0], None))
    assert contended == [HOLDER]  # once


def test_an_unfair_waiter_woken_to_compete_keeps_its_place_while_the_queue_counts_it_alive():
    """fair=False: a waiter woken with an empty message (the lock left free for it) asks with
    RETRY: it takes a free lock, else keeps its place as it is, and blocks again, no longer
    than its last join keeps it counted alive; a lease handed to it then is counted from the
    RETRY's send until that deadline at least. A block that runs out joins in full again."""
    clock = Clock()
    flow = flows.acquire(plan(clock, first="join", unfair=True, max_wait=60.0))
    first = next(flow)
    assert first.first.args[3] == flows.QUEUE
    alive_until = clock.now + (flows.BLOCK_CAP + flows.LIVENESS_SLACK)
    clock.now += 0.4
    retry = flow.send(([0, 9000, False, 0, b"1"], b""))  # woken to compete
    assert isinstance(retry, Block)
    assert retry.first.args[3] == flows.RETRY
    assert retry.first.args[5] == int((alive_until - clock.now) * 1000)  # what is left of it
    # Should it lose the race, it asks again on its own that soon (releases leave it be).
    assert retry.seconds == pytest.approx(LOST_RACE_RETRY_MS / 1000)
    assert not retry.exact
    clock.now += 0.1
    again = flow.send(([0, 9000, False, 0, b"2"], None))  # lost the race; the block ran out
    assert again.first.args[3] == flows.QUEUE  # in full, with a liveness of its own
    alive_until = clock.now + (flows.BLOCK_CAP + flows.LIVENESS_SLACK)
    clock.now += 0.2
    retry = flow.send(([0, 9000, False, 0, b"2"], b""))  # woken again
    assert retry.first.args[3] == flows.RETRY
    clock.now = alive_until - flows.LIVENESS_SLACK - 0.003
    retry = flow.send(([0, 9000, False, 0, b"3"], b""))  # lost; woken again, near its deadline
    assert retry.first.args[3] == flows.RETRY
    assert retry.seconds == pytest.approx(0.003)  # no longer than the queue counts it alive
    clock.now += 0.003
    again = flow.send(([0, 9000, False, 0, b"4"], None))
    assert again.first.args[3] == flows.QUEUE
    clock.now += 0.2
    retry = flow.send(([0, 9000, False, 0, b"3"], b""))
    assert retry.first.args[3] == flows.RETRY
    alive_until = clock.now - 0.2 + (flows.BLOCK_CAP + flows.LIVENESS_SLACK)
    sent_at = clock.now
    with pytest.raises(StopIteration) as done:
        flow.send(([0, 9000, False, 0, b"4"], b"0|5|0|5|"))  # handed (starved), 5 ms left
    assert done.value.value == flows.Acquired(0, int((alive_until - sent_at) * 1000), sent_at, "")


def test_a_fair_waiter_never_retries():
    clock = Clock()
    flow = flows.acquire(plan(clock, first="join", max_wait=60.0))
    next(flow)
    again = flow.send(([0, 9000, False, 0, b"1"], b""))
    assert again.first.args[3] == flows.QUEUE
