import re

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from redis.crc import key_slot

from django_redis_lock import Lock, registry
from django_redis_lock.core.lease import job_id_checked, reservation_token
from django_redis_lock.primitives.keys import lock_keys, namespace
from django_redis_lock.primitives.owners import job_token
from tests.conftest import django_redis_caches


def test_readable_names_are_kept():
    keys = lock_keys("reports:nightly", "default")
    assert keys.lease == "lock:{reports:nightly}"
    assert keys.queue == "lock:{reports:nightly}:q"
    assert keys.waiters == "lock:{reports:nightly}:d"
    assert keys.result == "lock:{reports:nightly}:r"
    assert keys.wake("abc") == "lock:{reports:nightly}:w:abc"


def test_cache_key_prefix_comes_first_and_version_is_ignored(settings, redis_url):
    settings.CACHES = django_redis_caches(redis_url)
    settings.CACHES["default"].update(KEY_PREFIX="shop", VERSION=7)
    settings.DJANGO_REDIS_LOCK_KEY_PREFIX = "locks"
    assert namespace("default") == "shop:locks:"
    assert lock_keys("x", "default").lease == "shop:locks:{x}"


@pytest.mark.parametrize(
    "name",
    ["a b", "{}", "{unclosed", "über", "x" * 10_000, "*?[]\\", "", "tab\there", "#abc"],
)
def test_other_names_are_hashed_into_one_tag(name):
    keys = lock_keys(name or "\0", "default")
    tag = re.fullmatch(r"lock:\{(#[0-9a-f]{32})\}", keys.lease)
    assert tag, keys.lease


def test_a_name_with_a_hash_tag_of_its_own_is_in_that_tags_slot():
    keys = lock_keys("account:{bank-1}:42", "default")
    assert re.fullmatch(r"lock:\{bank-1\}\{#[0-9a-f]{32}\}", keys.lease), keys.lease
    assert key_slot(keys.lease.encode()) == key_slot(b"{bank-1}") == key_slot(keys.queue.encode())
    # An unreadable tag is hashed, the same way for every name that carries it.
    first, second = lock_keys("a:{x y}:1", "default"), lock_keys("a:{x y}:2", "default")
    assert first.lease != second.lease
    assert key_slot(first.lease.encode()) == key_slot(second.lease.encode())


def test_distinct_names_get_distinct_keys():
    names = ["a b", "a  b", "A b", "{x}", "{x} ", "x{x}", "#0", "x" * 10_000, "x" * 10_001]
    assert len({lock_keys(name, "default").lease for name in names}) == len(names)


@hypothesis_settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(min_size=1, max_size=300))
def test_any_name_locks_and_unlocks(redis_client, name):
    lock = Lock(name, timeout=5, wait=0)
    assert lock.acquire()
    keys = lock_keys(name, "default")
    # All of one lock's keys in one Redis Cluster slot.
    assert keys.lease.endswith("}")
    slots = {key_slot(key.encode()) for key in (keys.lease, keys.queue, keys.wake("t"))}
    assert len(slots) == 1
    assert redis_client.pttl(keys.lease) > 0
    assert registry.get_lock(name).name == name  # from the key, or kept in the lease
    lock.release()
    assert redis_client.exists(keys.lease) == 0


_JOB_IDS = st.text(  # (the ids job_id_checked takes)
    st.characters(blacklist_categories=("Z", "Cc", "Cs"), blacklist_characters="|~"),
    min_size=1,
    max_size=128,
).filter(lambda job: job == job.strip() and not any(c.isspace() for c in job))


@given(_JOB_IDS, _JOB_IDS)
def test_two_jobs_never_share_a_result_key(first, second):
    """Each job's result is its own (a copy of an earlier job finds its record after a later
    job of the same key finished), in the lock's slot, never taken for a lease by the census
    (which lists keys ending with ``}``)."""
    keys = lock_keys("task:send:{k}", "default")
    key = keys.result_of(job_token(job_id_checked(first)))
    assert key == keys.result_of(reservation_token(first))  # one per job, whatever the token
    assert key not in (keys.result, keys.lease)
    assert not key.endswith("}")
    assert key_slot(key.encode()) == key_slot(keys.lease.encode())
    assert (key == keys.result_of(job_token(second))) == (first == second)
    assert keys.result_of("random-token") == keys.result


def test_owner_tokens_never_start_with_a_dash():
    """A token is typed on command lines (``redis_locks release-permit NAME TOKEN``), where a
    leading ``-`` reads as an option: 1 token in 64 would be refused."""
    from django_redis_lock.primitives import owners

    tokens = [owners.new_token() for _ in range(5000)]
    assert not [token for token in tokens if token.startswith("-")]
    assert all(len(token) == 16 for token in tokens)
    assert len(set(tokens)) == len(tokens)
