import pytest

from django_redis_lock import (
    LockBackendError,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)


@pytest.mark.parametrize("cls", [LockNotAcquired, LockNotOwned, LockLost, LockBackendError])
def test_every_lock_failure_is_a_lock_error(cls):
    assert issubclass(cls, LockError)
    assert not issubclass(cls, (ValueError, TypeError))


def test_not_acquired_names_the_holder_and_the_lease():
    error = LockNotAcquired(
        "reports:nightly",
        ttl=12.5,
        waited=5,
        owner={
            "host": "web-1",
            "pid": 4242,
            "thread": "MainThread",
            "label": "nightly report",
            "acquired_at": 1_790_000_000.5,
        },
    )
    assert error.name == "reports:nightly"
    assert error.ttl == 12.5
    assert error.owner["pid"] == 4242
    assert str(error) == (
        "Could not acquire lock 'reports:nightly' within 5s: held by web-1/4242/MainThread "
        "(nightly report) since 2026-09-21 14:13:20 UTC, lease ends in 12.5s"
    )


def test_not_acquired_with_nothing_known():
    error = LockNotAcquired("x")
    assert str(error) == "Could not acquire lock 'x'"
    assert error.owner is None
    assert error.ttl is None


def test_owner_record_is_copied():
    owner = {"host": "a"}
    error = LockNotAcquired("x", owner=owner)
    owner["host"] = "b"
    assert error.owner == {"host": "a"}


def test_other_errors_carry_the_name():
    error = LockLost("lease of 'x' ended while held", name="x")
    assert error.name == "x"
    assert str(error) == "lease of 'x' ended while held"
