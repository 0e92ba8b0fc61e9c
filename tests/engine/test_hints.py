"""Options people bring from other lock libraries get a TypeError naming ours, from the entry
point they called (not ``Lock.__init__()`` when they wrote ``@lock``)."""

from __future__ import annotations

import pytest

from django_redis_lock import (
    Lock,
    get_or_set_locked,
    lock,
    locked_method,
    prevent_double_submit,
    run_once,
)
from tests.testapp.models import Account


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Lock("x", blocking_timeout=5), r"^Lock\(\) got .* 'blocking_timeout': use wait="),
        (lambda: Lock("x", expire=60), r"^Lock\(\) got .* 'expire': use timeout="),
        (lambda: Lock("x", sleep=0.1), r"'sleep': there is none here, waiters are woken"),
        (lambda: Lock("x", colour=1), r"^Lock\(\) got .* 'colour'; it takes auto_renew=, "),
        (lambda: lock("x", blocking=False), r"^@lock\(\) got .* 'blocking': use wait="),
        (lambda: lock("x", colour=1), r"^@lock\(\) got .* 'colour'; it takes auto_renew="),
        (lambda: locked_method(expire=3), r"^@locked_method\(\) got .* 'expire': use timeout="),
        (lambda: run_once("k", ttl=60, expire=3), r"^run_once\(\) got .* 'expire': use ttl="),
        (lambda: prevent_double_submit(method="POST"), r"'method': use methods="),
        (lambda: prevent_double_submit(rate="5/m"), r"'rate': there is none here"),
        (
            lambda: get_or_set_locked("k", int, blocking_timeout=1),
            r"'blocking_timeout': use wait=",
        ),
        (
            lambda: Account(pk=1).lock(auto_renewal=True),
            r"^lock\(\) got .* 'auto_renewal': use auto_renew=",
        ),
    ],
)
def test_familiar_names_are_pointed_to_ours(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_our_own_names_still_work():
    assert run_once("k", ttl=60).ttl == 60
    assert Lock("x", timeout=3, wait=0).name == "x"
