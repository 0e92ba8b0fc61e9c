"""A hold belongs to the process (and thread or task) that took it: not to a forked child,
not to a copy, not to an unpickled Lock."""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from django_redis_lock import Lock, LockNotOwned
from django_redis_lock.primitives.keys import lock_keys
from tests.support import workers

SPAWN = multiprocessing.get_context("spawn")


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_forked_child_cannot_release_renew_or_reenter_its_parents_lock(
    redis_url, redis_client, reentrant
):
    with ProcessPoolExecutor(1, mp_context=SPAWN) as pool:
        seen = pool.submit(workers.fork_inside_the_lock, redis_url, "forked", reentrant).result(60)
    assert seen["child"] == {
        "release": "LockNotOwned",  # without touching Redis
        "acquire": False,  # the parent holds it: no re-entry into the parent's hold
        "other_acquire": False,
        "exit": "quiet",  # leaving the with block does nothing to Redis, and does not raise
    }
    assert seen["parent_still_owns"] is True
    assert seen["third_party_acquired"] is False
    assert "exit" not in seen  # the parent left its with block normally, releasing the lock
    assert not redis_client.exists(lock_keys("forked", "default").lease)


@pytest.mark.parametrize(
    "make_copy", [copy.copy, copy.deepcopy, lambda lock: pickle.loads(pickle.dumps(lock))]
)
def test_a_copy_is_a_new_unheld_lock_with_the_same_options(redis_client, make_copy):
    original = Lock("copied", timeout=7, wait=0, fencing=True, label="nightly")
    original.acquire()
    twin = make_copy(original)
    assert isinstance(twin, Lock)
    assert (twin.name, twin.label) == ("copied", "nightly")
    assert (twin.token, twin.fencing_token) == (None, None)
    with pytest.raises(LockNotOwned):
        twin.release()  # the copy never shares the hold...
    assert original.owned()  # ...so it cannot release it from under its owner
    assert twin.acquire() is False  # it is another contender (wait=0 was copied too)
    original.release()
    assert twin.acquire() is True
    assert 0 < redis_client.pttl(lock_keys("copied", "default").lease) <= 7000
    assert twin.fencing_token is not None  # fencing=True was copied
    twin.release()


def test_an_unheld_lock_pickles_with_its_quorum_members():
    twin = pickle.loads(pickle.dumps(Lock("q", using=["a", "b", "c"], auto_renew=False)))
    assert repr(twin) == "<Lock 'q'>"
    assert twin.__reduce__()[0].keywords["using"] == ("a", "b", "c")


def test_a_forked_child_never_draws_its_parents_tokens():
    """Tokens come from a buffer of random bytes: a child must not inherit it, or its next
    token would be its parent's next one (two holders with one token)."""
    from django_redis_lock.primitives import owners

    owners.new_token()  # the parent has random bytes in store now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, owners.new_token().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child_token = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert len(child_token) == 16
    assert child_token != owners.new_token()
