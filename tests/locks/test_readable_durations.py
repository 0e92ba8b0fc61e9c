"""Durations as people read them (``durations.readable``), in every message that shows one:
"its hold ends in 1h", not "3.6e+03s" (issue 27)."""

from __future__ import annotations

import io
import logging
import math
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest
from django.core.management import call_command
from hypothesis import given
from hypothesis import strategies as st

from django_redis_lock import DuplicateTask, Lock, LockNotAcquired
from django_redis_lock.admin_display import entry_rows
from django_redis_lock.backends.wire import no_reply
from django_redis_lock.core.durations import MAX_SECONDS, readable, readable_elapsed
from django_redis_lock.core.release import Unconfirmed
from django_redis_lock.management import lines
from django_redis_lock.primitives.errors import backend_error
from django_redis_lock.registry.census import Census, Entry
from django_redis_lock.registry.records import LockInfo

DAY = 24 * 3600


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0004, "0.4ms"),
        (0.00123, "1.23ms"),
        (0.25, "250ms"),
        (0.9994, "999ms"),
        (0.9996, "1s"),  # not "1000ms"
        (1, "1s"),
        (9.996, "10s"),
        (12.345, "12.3s"),
        (30.0, "30s"),
        (59.5, "59.5s"),
        (59.94, "59.9s"),
        (59.96, "1m"),  # not "60s"
        (60, "1m"),
        (90, "1m 30s"),
        (3599.4, "59m 59s"),
        (3599.6, "1h"),
        (3600, "1h"),
        (3605, "1h 5s"),
        (3660, "1h 1m"),
        (3661, "1h 1m 1s"),
        (DAY - 0.6, "23h 59m 59s"),
        (DAY - 0.4, "1d"),
        (DAY + 29, "1d"),  # whole minutes from a day on
        (90061, "1d 1h 1m"),
        (MAX_SECONDS, "365d"),
        (math.inf, "for ever"),
        (-1.5, "-1.5s"),
    ],
)
def test_readable(seconds, text):
    assert readable(seconds) == text


_UNITS = {"d": DAY, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
_SHORT = re.compile(r"(\d+(?:\.\d{1,2})?)(ms|s)")
_LONG = re.compile(r"(?:(\d+)d)? ?(?:(\d+)h)? ?(?:(\d+)m)? ?(?:(\d+)s)?")


def read_back(text: str) -> float:
    """The seconds a reader takes ``text`` for, or AssertionError if it is not one of the
    forms ``readable`` promises."""
    if short := _SHORT.fullmatch(text):
        assert len(short[1].replace(".", "").lstrip("0")) <= 3, text  # 3 significant digits
        return float(short[1]) * _UNITS[short[2]]
    long = _LONG.fullmatch(text)
    assert long, text
    counts = [int(count or 0) for count in long.groups()]
    # Largest unit first, none of them zero, one space between them.
    assert " ".join(f"{n}{u}" for n, u in zip(counts, "dhms", strict=True) if n) == text
    assert counts[1] < 24, text
    assert counts[2] < 60, text
    assert counts[3] < 60, text
    assert 0 in counts, text  # three units at most
    return sum(count * unit for count, unit in zip(counts, (DAY, 3600, 60, 1), strict=True))


finite = st.floats(min_value=0, max_value=MAX_SECONDS * 10, allow_nan=False)


@given(finite)
def test_readable_is_close_to_the_duration(seconds):
    # 0.5 % from three significant digits, 0.83 % from whole seconds at a minute.
    assert read_back(readable(seconds)) == pytest.approx(seconds, rel=0.01, abs=0.000005)


@given(finite, finite)
def test_a_longer_duration_never_reads_shorter(one, other):
    shorter, longer = sorted((one, other))
    assert read_back(readable(shorter)) <= read_back(readable(longer))


@given(st.floats())
def test_any_number_gives_a_text(seconds):
    text = readable(seconds)
    assert isinstance(text, str)
    assert "e+" not in text
    assert "e-" not in text


# -- the messages -------------------------------------------------------------------------


def test_a_duplicate_task_says_when_its_hold_ends_as_people_read_it():
    error = DuplicateTask(
        "task:shop.sync:42", task="shop.sync", task_id="abc", queued=True, ttl=3600
    )
    assert str(error) == (
        "Task shop.sync is queued already as abc (guard key 'task:shop.sync:42'); its hold "
        "ends in 1h unless it starts"
    )


def test_lock_not_acquired_says_the_wait_and_the_lease_as_people_read_them():
    error = LockNotAcquired("report", waited=90, ttl=0.25)
    assert str(error) == "Could not acquire lock 'report' within 1m 30s, lease ends in 250ms"


def test_a_wait_that_runs_out_is_told_and_logged_as_people_read_it(caplog):
    def wait_for_it():
        with Lock("readable:wait", wait=0.2):
            pass

    caplog.set_level(logging.INFO, logger="django_redis_lock")
    with Lock("readable:wait", timeout=3600), ThreadPoolExecutor(1) as other_thread:
        refused = other_thread.submit(wait_for_it)
        with pytest.raises(LockNotAcquired) as raised:
            refused.result(timeout=30)
    error = raised.value
    assert f" within {readable(error.waited)}: " in str(error)  # "200ms", not "0.2s"
    assert str(error).endswith(f", lease ends in {readable(error.ttl)}")  # "1h", not "3.6e+03s"
    logged = caplog.text
    assert "Waiting up to 200ms for lock 'readable:wait'" in logged
    assert "Gave up on lock 'readable:wait' after waiting 200ms" in logged


def test_redis_errors_say_the_time_allowed_as_people_read_it():
    assert str(no_reply(3600)) == "Redis did not answer within 1h"
    error = backend_error("report", "acquire", Unconfirmed(0, 1), replica_timeout=0.1)
    assert "confirmed it within 100ms," in str(error)


def test_the_admin_and_the_commands_show_durations_as_people_read_them():
    assert readable_elapsed(3725.9) == "1h 2m 6s"  # ages: whole seconds, rounded
    assert readable_elapsed(-0.2) == "0s"  # (a taker's clock a little ahead)
    assert readable_elapsed(None) == "?"
    entry = Entry(kind="lock", name="report", group="report", holders=1, waiting=0,
                  held_for=90.0, ends_in=3600.0)  # fmt: skip
    assert entry_rows([entry]) == [(entry, "1m 30s", "1h", "report")]
    printed = lines.stats(Census((entry,), keys_scanned=1, complete=True), top=1)
    assert re.search(r"  1m 30s +1h$", printed[-1]), printed  # HELD FOR, ENDS IN


def test_redis_locks_list_shows_the_ttl_as_people_read_it():
    with Lock("readable:list", timeout=3600):
        out = io.StringIO()
        call_command("redis_locks", "list", stdout=out)
    [row] = [line for line in out.getvalue().splitlines() if line.startswith("readable:list")]
    # Read a moment after it was taken: the whole hour, or just under it on a slow machine.
    assert re.search(r"  (1h|59m 5\ds)( |$)", row), row  # its TTL column


def test_a_lock_s_age_is_one_figure_for_the_admin_and_redis_locks():
    """The record says how long it has been held (``LockInfo.held_for``); the admin's Locks
    page and ``redis_locks list`` print that one figure, rounded alike."""
    acquired = datetime.now(timezone.utc) - timedelta(seconds=89.6)
    info = LockInfo(key="k", name="report", token="t", ttl=30.0, acquired_at=acquired)
    assert 89.6 <= info.held_for < 89.6 + 60  # (read now: a slow machine adds to it)
    assert LockInfo(key="k", name="report", token="t", ttl=30.0).held_for is None
