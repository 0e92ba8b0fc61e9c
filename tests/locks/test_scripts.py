import time

import pytest
import redis
from redis.connection import Connection

from django_redis_lock import Lock
from django_redis_lock.backends.scripts import EXTEND
from django_redis_lock.backends.wire import execute, execute_many, pack


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
