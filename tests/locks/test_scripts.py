import time

import pytest
import redis
from redis.connection import Connection

from django_redis_lock import Lock
from django_redis_lock.backends.scripts import (
    EXTEND,
    JOIN,
    PERMIT_ACQUIRE,
    QUEUE_TTL_MS,
    RELEASE,
    WAKE,
)
from django_redis_lock.backends.wire import execute, execute_many, pack
from django_redis_lock.primitives.keys import lock_keys, permit_keys


@pytest.mark.parametrize(
    "args",
    [
        ("PING",),
        ("SET", "k", "v", "NX", "PX", 30000),
        ("EVALSHA", EXTEND.sha, 1, "lock:{über}", -1, 0, 2.5, b"\x00\xff"),
        ("ECHO", "x" * 10_000),
    ],
)
def test_our_packing_matches_redis_pys(args):
    assert pack(args) == b"".join(Connection().pack_command(*args))


def test_execute_sends_once_and_returns_the_raw_reply(redis_client):
    assert execute(redis_client, "SET", "k", "ünï") == b"OK"
    assert execute(redis_client, "GET", "k") == "ünï".encode()
    with pytest.raises(redis.ResponseError):
        execute(redis_client, "INCR", "k")
    assert execute(redis_client, "PING") in (b"PONG", "PONG", True)  # still in step


def test_execute_many_returns_errors_in_place(redis_client):
    redis_client.set("text", "not a number")
    replies = execute_many(redis_client, [("SET", "a", "1"), ("INCR", "text"), ("GET", "a")])
    assert replies[0] == b"OK"
    assert isinstance(replies[1], redis.ResponseError)
    assert replies[2] == b"1"  # the connection stayed in step after the error


def test_batched_renewal_survives_script_flush(settings, redis_client):
    # (A 1 s lease, renewed a third of the way: 0.67 s to spare for a renewal that reloads the
    # script. With 0.3 s, a loaded 2-core machine's stalls sometimes outlasted the 0.2 s left.)
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 1.0
    with Lock("flushed-a") as a, Lock("flushed-b") as b:
        redis_client.script_flush()
        for _ in range(3):  # three leases: renewals must have reloaded the script
            assert a.owned()
            assert b.owned()
            time.sleep(1.0)
        assert not a.lost
        assert not b.lost


# -- a join that arrives after its own leave -----------------------------------------------------
# A sync caller interrupted while its join (and the block behind it) was on its way closes that
# connection and steps out of the line on another: the leave may run first. Found by the
# simulation of the library's own code (tests/simulation/runtime/: a permit handed to nobody).
# The leave marks the token's wake-up list (LEFT), and a request of that token arriving later
# queues nothing and takes nothing, whatever came before (a review found the first fix, a mark
# only when no entry was found, left a re-join and a handed lease uncovered).


def _join(client, keys, token, mode, flags="ob"):
    args = (token, 10_000, "record", mode, flags, 3000)
    wake = keys.wake(token)
    return client.evalsha(
        JOIN.sha, 5, keys.lease, keys.queue, keys.waiters, wake, keys.result, *args
    )


def _permit(client, keys, token, mode, flags="ob"):
    args = (token, 10_000, "record", mode, flags, 3000, 2)
    return client.evalsha(
        PERMIT_ACQUIRE.sha, 5, keys.lease, keys.owners, keys.queue, keys.waiters,
        keys.wake(token), *args,
    )  # fmt: skip


@pytest.fixture
def scripts_loaded(redis_client):
    for script in (JOIN, PERMIT_ACQUIRE, RELEASE):
        redis_client.script_load(script.source)


def _mark_kept(client, wake):
    assert client.lrange(wake, 0, -1) == [b"!left"]
    assert 0 < client.pttl(wake) <= QUEUE_TTL_MS


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("queued_before", [False, True])
def test_a_join_after_its_own_leave_takes_and_queues_nothing(
    redis_client, scripts_loaded, held, queued_before
):
    keys = lock_keys("late-join", "default")
    redis_client.set(keys.lease, "holder|0|0|record", px=10_000)
    if queued_before:  # (an earlier join of the same acquisition arrived: a re-join is late)
        assert _join(redis_client, keys, "late", 1)[0] == 0
    if not held:
        redis_client.delete(keys.lease)
    assert _join(redis_client, keys, "late", 3, "") == [0, 0, None]  # the leave, first
    _mark_kept(redis_client, keys.wake("late"))
    reply = _join(redis_client, keys, "late", 1)  # the join, after it
    assert reply[0] == 0
    assert redis_client.get(keys.lease) == (b"holder|0|0|record" if held else None)
    assert redis_client.lrange(keys.queue, 0, -1) == []
    assert redis_client.hget(keys.waiters, "late") is None
    _mark_kept(redis_client, keys.wake("late"))  # (the block behind it pops it at once)
    # Any other token queues and takes as before.
    assert _join(redis_client, keys, "other", 1)[0] == (0 if held else 1)


def test_a_join_after_a_leave_that_found_the_lock_handed_to_it_takes_nothing(
    redis_client, scripts_loaded
):
    keys = lock_keys("late-handed", "default")
    redis_client.set(keys.lease, "late|0|0|record", px=3000)  # handed to it by a release
    reply = _join(redis_client, keys, "late", 3, "")
    assert reply[0] == 1  # the leave finds it its own, and its flow passes it on:
    assert redis_client.evalsha(RELEASE.sha, 5, *keys.release_keys(""), "late", "") == 0
    assert _join(redis_client, keys, "late", 1)[0] == 0  # the late join, after all that
    assert redis_client.get(keys.lease) is None


def test_a_permit_request_after_its_own_leave_takes_and_queues_nothing(
    redis_client, scripts_loaded
):
    keys = permit_keys("late-permit", "default")
    assert _permit(redis_client, keys, "late", 3, "") == [0, 0, None]
    _mark_kept(redis_client, keys.wake("late"))
    assert _permit(redis_client, keys, "late", 1)[0] == 0
    assert redis_client.zcard(keys.lease) == 0  # no permit taken by nobody
    assert redis_client.lrange(keys.queue, 0, -1) == []
    assert _permit(redis_client, keys, "other", 1)[0] == 1


def test_wake_pushes_each_message_with_its_lists_expiry(redis_client):
    """``wake.lua``: a release's wake-ups for waiters it did not expect, each list with its
    message and its expiry in one step (a push without its expiry could be left for ever)."""
    keys = lock_keys("wake-script", "default")
    lists = (keys.wake("w1"), keys.wake("w2"))
    assert WAKE(redis_client, lists, ["0|3000|0|w2", 3000, "", 1000]) == 2
    assert redis_client.lrange(lists[0], 0, -1) == [b"0|3000|0|w2"]
    assert redis_client.lrange(lists[1], 0, -1) == [b""]
    assert 0 < redis_client.pttl(lists[0]) <= 3000
    assert 0 < redis_client.pttl(lists[1]) <= 1000
