"""Every duration has one bound, checked before Redis is touched, and no error path leaves a
key of ours without an expiry (whatever fails inside a script, Lua does not roll back)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import redis
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redis_lock import (
    Lock,
    LockBackendError,
    LockNotOwned,
    get_redis_client,
    prevent_double_submit,
    registry,
    run_once,
)
from django_redis_lock.backends.scripts import EXTEND, JOIN, RELEASE, TAKE
from django_redis_lock.core.durations import MAX_SECONDS, milliseconds, seconds
from django_redis_lock.core.lease import OwnerRecord, encode_lease
from django_redis_lock.primitives.keys import lock_keys
from tests.conftest import django_redis_caches
from tests.support.helpers import keys_left, keys_without_ttl

TOO_LONG = [1e15, 10**400, 1e300, MAX_SECONDS + 1]
TOO_SHORT = [1e-9, 0.0009]


def lease_key(name):
    return lock_keys(name, "default").lease


# -- checked up front: ValueError, never a half-written key ---------------------------------


@pytest.mark.parametrize("value", TOO_LONG + TOO_SHORT)
def test_a_lease_out_of_bounds_is_a_value_error_before_redis_is_touched(settings, value):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")  # nothing listens there
    with pytest.raises(ValueError, match="timeout"):
        Lock("t", timeout=value)


def test_the_bounds_themselves_are_accepted(redis_client):
    for value in (MAX_SECONDS, Fraction(1, 2)):
        with Lock("t", timeout=value):
            assert 0 < redis_client.pttl(lease_key("t")) <= round(value * 1000)
    assert Lock("t", timeout=0.001).acquire()  # 1 ms: gone before we could look


def test_the_eternal_lock_of_the_issue_cannot_happen(redis_client):
    """Before: timeout=1e15 raised LockBackendError and left lock:{t} with no TTL, for ever."""
    with pytest.raises(ValueError, match="a year"):
        Lock("t", timeout=1e15).acquire()
    assert not redis_client.exists(lease_key("t"))
    assert Lock("t", timeout=5, wait=0).acquire()


@pytest.mark.parametrize("value", TOO_LONG + TOO_SHORT + [0, -1, math.nan, math.inf])
def test_extend_is_bounded_the_same_way(redis_client, value):
    with Lock("t", timeout=10) as held:
        with pytest.raises(ValueError, match="seconds"):
            held.extend(value)
        assert 0 < redis_client.pttl(lease_key("t")) <= 10_000  # untouched


@pytest.mark.parametrize("value", TOO_LONG)
def test_a_wait_is_bounded_but_may_be_zero_or_infinite(value):
    with pytest.raises(ValueError, match="wait"):
        Lock("t", wait=value)
    with pytest.raises(ValueError, match="wait"):
        Lock("t").acquire(wait=value)
    Lock("t", wait=0)
    Lock("t", wait=1e-9)  # a wait is no expiry: any fraction of a second is fine
    Lock("t", wait=math.inf)


@pytest.mark.parametrize("value", TOO_LONG + TOO_SHORT)
def test_replay_and_once_durations_are_bounded(value):
    with pytest.raises(ValueError, match="hold"):
        prevent_double_submit(hold=value)
    with pytest.raises(ValueError, match="idempotency_ttl"):
        prevent_double_submit(idempotency_ttl=value)
    with pytest.raises(ValueError, match="ttl"):
        run_once("k", ttl=value)


@pytest.mark.parametrize(
    ("name", "value"),
    [("TIMEOUT", 1e15), ("TIMEOUT", 1e-9), ("WAIT", 1e15), ("REPLICA_TIMEOUT", 10**400)],
)
def test_manage_py_check_refuses_a_setting_out_of_bounds(settings, name, value):
    setattr(settings, f"DJANGO_REDIS_LOCK_{name}", value)
    [message] = [m for m in checks.run_checks() if m.id.startswith("django_redis_lock.")]
    assert message.id == "django_redis_lock.E005"
    assert f"DJANGO_REDIS_LOCK_{name}" in message.msg
    assert "a year" in message.msg or "1 ms" in message.msg


@pytest.mark.parametrize("value", ["1e15", "1e-9"])
def test_a_command_lease_out_of_bounds_is_a_usage_error(value):
    with pytest.raises(CommandError, match="lock-timeout"):
        call_command("run_locked", "--lock-timeout", value, "check")


def test_durations_are_sent_in_whole_milliseconds_rounded():
    assert milliseconds(seconds(0.0016, "t")) == 2
    assert milliseconds(seconds(0.0014, "t")) == 1
    assert milliseconds(seconds(MAX_SECONDS, "t")) == MAX_SECONDS * 1000
    with pytest.raises(TypeError):
        seconds("30", "t")
    with pytest.raises(TypeError):
        seconds(True, "t")


# -- and if something does reach Redis, the scripts refuse it before writing -----------------


@pytest.mark.parametrize("lease_ms", [10**17, 0, -5, 1.5, "soon"])
def test_the_scripts_refuse_a_bad_duration_before_writing_anything(redis_client, lease_ms):
    client = get_redis_client()
    keys = lock_keys("raw", "default")
    key = keys.lease
    joining = (key, keys.queue, keys.waiters, keys.wake("tok"), keys.result)
    record = "10000|1|host|thread||||"
    for script, args in (
        (JOIN, ["tok", lease_ms, record, 1, "f", 1000]),
        (JOIN, ["tok", 1000, record, 1, "f", lease_ms]),  # liveness
        (TAKE, ["tok", lease_ms, record, "f"]),
    ):
        with pytest.raises(redis.ResponseError, match="invalid duration"):
            script(client, joining[: 5 if script is JOIN else 1], args)
    assert keys_left(redis_client) == []
    JOIN(client, joining, ["tok", 10_000, record, 1, "", 1000])
    with pytest.raises(redis.ResponseError, match="invalid duration"):
        EXTEND(client, [key], ["tok", lease_ms])
    with pytest.raises(redis.ResponseError, match="invalid duration"):
        RELEASE(client, keys.release_keys(""), ["tok", "", "", b"result", lease_ms])
    assert redis_client.exists(key)  # still held: the release stopped before deleting
    assert keys_without_ttl(redis_client) == []


@pytest.mark.parametrize(
    ("planted_key", "kind", "options"),
    [
        (":q", "string", {}),  # the queue, not a list: fails when a waiter joins it
        (":d", "string", {}),  # the waiters' deadlines, not a hash
    ],
)
def test_a_sibling_key_of_the_wrong_type_never_leaves_a_key_without_expiry(
    redis_client, planted, planted_key, kind, options
):
    """Someone wrote one of the lock's other keys by hand, before or while it is held: the
    scripts fail (LockBackendError, saying why), and every key they wrote before failing still
    has an expiry."""
    key = lease_key("typed") + planted_key

    def plant():
        redis_client.delete(key)
        if kind == "hash":
            redis_client.hset(key, "x", "y")
        else:
            redis_client.set(key, "not what the lock keeps there")
        planted.add(key)

    failures = []
    for plant_first in (True, False):
        redis_client.flushdb()
        if plant_first:
            plant()
        holder = Lock("typed", timeout=10, **options)
        waiter = Lock("typed", timeout=10, wait=0.05, **options)
        for attempt in (holder.acquire, plant, waiter.acquire, holder.release):
            try:
                attempt()
            except LockBackendError as error:
                failures.append(str(error))
            except LockNotOwned:
                pass  # the holder could not take it in the first place
            assert keys_without_ttl(redis_client, exempt=planted) == [], attempt
    assert failures, "the wrong type went unnoticed"
    assert all("WRONGTYPE" in failure or "ResponseError" in failure for failure in failures)


def test_out_of_memory_never_leaves_a_key_without_expiry(redis_server_factory, settings):
    """A Redis over maxmemory (noeviction) refuses writes: the lock fails with LockBackendError,
    and nothing it managed to write is left without an expiry."""
    server = redis_server_factory()
    client = redis.Redis.from_url(server.url)
    settings.CACHES = django_redis_caches(server.url)
    holder = Lock("oom", timeout=10, fencing=True)
    assert holder.acquire()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)  # any write from now on is over the limit
    outcomes = []
    for options in ({}, {"fencing": True}, {"reentrant": True}):
        name = f"oom-{'-'.join(options) or 'plain'}"
        lock = Lock(name, timeout=10, wait=0.05, **options)
        try:
            outcomes.append(lock.acquire())
        except LockBackendError as error:
            outcomes.append(str(error))
    waiter = Lock("oom", timeout=10, wait=0.05)
    try:
        outcomes.append(waiter.acquire())
    except LockBackendError as error:
        outcomes.append(str(error))
    assert any("maxmemory" in str(outcome) for outcome in outcomes), outcomes
    assert keys_without_ttl(client) == []
    client.config_set("maxmemory", 0)
    holder.release()
    client.close()


# -- ttl() and the registry never hide a key without an expiry ------------------------------


def test_ttl_shows_a_key_without_expiry_instead_of_hiding_it(redis_client, planted):
    key = lease_key("eternal")
    redis_client.set(key, encode_lease("t", 1, 0, OwnerRecord(5, 1, "host", "thread").encode()))
    planted.add(key)
    lock = Lock("eternal", timeout=5)
    assert lock.locked()
    assert lock.ttl() == math.inf  # before: None, as if nobody held it
    info = registry.get_lock("eternal")
    assert info.ttl == math.inf
    assert not info.expires
    assert info.as_dict()["ttl"] is None
    assert Lock("free", timeout=5).ttl() is None
