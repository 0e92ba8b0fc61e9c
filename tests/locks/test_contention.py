"""A lock this process found busy lately is joined at once, by any ``Lock`` object of it: a
bare ``SET`` first would fail, one round trip for nothing (``primitives/contention.py``)."""

from __future__ import annotations

import threading

import pytest

from django_redis_lock import Lock
from django_redis_lock.primitives.contention import MEMORY, MOST, Contention
from django_redis_lock.primitives.keys import lock_keys
from tests.support.helpers import wait_until


def calls(client, name: str) -> int:
    return client.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0)


def make_busy(redis_client, name: str, fair: bool) -> None:
    """An acquisition of ``name`` in this process that has to wait for another holder."""
    holder = Lock(name, timeout=10)
    assert holder.acquire()
    waited = threading.Event()

    def wait_for_it():
        with Lock(name, wait=10, fair=fair):
            waited.set()

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    try:
        wait_until(lambda: redis_client.llen(lock_keys(name, "default").queue), what="queued")
    finally:
        holder.release()
    assert waited.wait(10)
    waiter.join()


def commands_of(redis_client, cycle) -> tuple[int, int]:
    """(SETs, script calls) that ``cycle()`` made Redis run. A script's own SET counts too:
    a bare SET that took the lock and a join that took it free both count one; a bare SET
    that failed before a join, two."""
    sets, scripts = calls(redis_client, "set"), calls(redis_client, "evalsha")
    cycle()
    return calls(redis_client, "set") - sets, calls(redis_client, "evalsha") - scripts


def acquired_and_released(name: str, **options) -> None:
    with Lock(name, **options):
        pass


def test_a_new_lock_object_of_a_busy_lock_joins_its_line_at_once(redis_client):
    make_busy(redis_client, "contention-busy", fair=True)
    # A new object, in this process, the lock free now: the join takes it (its SET), then the
    # release; no bare SET tried first.
    assert commands_of(redis_client, lambda: acquired_and_released("contention-busy")) == (1, 2)
    # A lock never found busy: a bare SET takes it, then the release.
    never = lambda: acquired_and_released("contention-never-busy")  # noqa: E731
    assert commands_of(redis_client, never) == (1, 1)


@pytest.mark.parametrize("fair", [True, False])
def test_fair_false_tries_a_bare_set_first_however_busy(redis_client, fair):
    name = f"contention-busy-{fair}"
    make_busy(redis_client, name, fair=fair)
    # Its releases leave the lock free for whoever asks first: a bare SET is its best try.
    cycle = lambda: acquired_and_released(name, fair=False)  # noqa: E731
    assert commands_of(redis_client, cycle) == (1, 1)


def test_the_memory_forgets_after_a_while_and_keeps_a_bounded_number():
    contention = Contention()
    contention.saw("a", 100.0)
    assert contention.lately("a", 100.0 + MEMORY / 2)
    assert not contention.lately("a", 100.0 + MEMORY)
    assert not contention.lately("b", 100.0)
    for number in range(MOST + 10):
        contention.saw(f"k{number}", 200.0)
    assert not any(contention.lately(f"k{number}", 200.0) for number in range(10))
    assert all(contention.lately(f"k{number}", 200.0) for number in range(10, MOST + 10))
    contention.saw("k10", 201.0)  # seen again: now the newest, forgotten last
    contention.saw("one more", 201.0)
    assert contention.lately("k10", 201.0)
    assert not contention.lately("k11", 201.0)  # the oldest now
