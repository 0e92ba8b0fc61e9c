"""Durations: the one rule every number of seconds we are given must follow.

Leases, extensions, renewals, waits, and the times results are kept (``hold``,
``idempotency_ttl``, ``run_once(ttl=...)``) are all checked here, before Redis is touched, so
that a duration Redis would refuse can never leave a half-written key behind:

- a number (``int`` or ``float``; ``True`` is not one second, and ``"30"`` is not a number);
- at most :data:`MAX_SECONDS` (a year): far beyond any lease or replay window, far below
  what a Redis expiry or a Lua number can hold exactly;
- a duration that becomes a key's expiry is at least :data:`MIN_SECONDS` (1 ms, the unit
  Redis keeps it in), and is sent rounded to the nearest millisecond;
- a wait may be ``0`` (do not wait) and, where allowed, ``float("inf")`` (wait for ever).

And :func:`readable`: how a duration is shown to people, in our exceptions and log lines, by
``manage.py redis_locks``, and in the admin's ages and Hot locks.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, cast

__all__ = [
    "MAX_SECONDS",
    "MIN_SECONDS",
    "clock_allowance",
    "milliseconds",
    "readable",
    "seconds",
]

MAX_SECONDS = 365 * 24 * 3600
MIN_SECONDS = 0.001

_DAY = 24 * 3600


def seconds(value: Any, what: str, *, wait: bool = False, allow_inf: bool = False) -> float:
    """``value`` as a checked number of seconds, or ``TypeError`` / ``ValueError`` naming
    ``what``. A ``wait`` may be zero (and any fraction of a millisecond); anything else is an
    expiry, at least :data:`MIN_SECONDS`. ``allow_inf`` admits ``float("inf")``."""
    # bool is an int subclass: a duration of True is a mistake, not one second.
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}.")
    value = cast(float, value)  # a Real: int, float, Fraction, numpy's floats...
    if value != value:  # NaN, also for Real types that math.isnan cannot take
        raise ValueError(f"{what} must be a number of seconds, not NaN.")
    if value == math.inf and allow_inf:
        return math.inf
    # Compared before float(): float(10**400) raises OverflowError, not a useful message.
    if value > MAX_SECONDS:
        raise ValueError(
            f"{what} must be at most {MAX_SECONDS} seconds (a year), not {_shown(value)}"
            + (", or float('inf') to wait for ever." if allow_inf else ".")
        )
    if value < 0 or (value == 0 and not wait):
        bound = "zero or more" if wait else "more than zero"
        raise ValueError(f"{what} must be {bound} seconds, not {_shown(value)}.")
    if not wait and value < MIN_SECONDS:
        raise ValueError(
            f"{what} must be at least {MIN_SECONDS} seconds (1 ms, the smallest time Redis "
            f"keeps), not {_shown(value)}."
        )
    return float(value)


def _shown(value: Any) -> str:
    """``value`` for a message: 10**400 is not worth 401 digits."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} characters)"


def milliseconds(checked: float) -> int:
    """A duration checked by :func:`seconds` as Redis takes it: whole milliseconds."""
    return max(1, round(checked * 1000))


def clock_allowance(lease: float) -> float:
    """How much sooner than ``lease`` seconds after a request we count a lease as ended: the
    Redis server's clock may run a little faster than ours (Redlock's 1 %, plus 2 ms for the
    time we take to act on an answer)."""
    return lease * 0.01 + 0.002


def readable(value: float) -> str:
    """``value`` seconds as people read a duration: ``"250ms"``, ``"59.5s"``, ``"1m 30s"``,
    ``"1h 1m"``, ``"1d 1h 1m"``. Under a minute, three significant digits (two decimals at
    most); then whole seconds, and from a day on whole minutes (three units at most).
    ``float("inf")`` is ``"for ever"``. Never powers of ten, as ``f"{3600:.3g}s"`` gives
    (``"3.6e+03s"``)."""
    if not math.isfinite(value):
        return "for ever" if value > 0 else repr(value)  # -inf, nan: a bug, shown as it is
    if value < 0:
        return f"-{readable(-value)}"
    if value == 0:
        return "0s"
    # Each unit's text is rounded first: 0.9996 s is "1s", not "1000ms"; 59.97 s is "1m".
    milliseconds = _significant(value * 1000)
    if float(milliseconds) < 1000:
        return f"{milliseconds}ms"
    text = _significant(value)
    if float(text) < 60:
        return f"{text}s"
    whole = round(value) if value < _DAY else round(value / 60) * 60
    days, rest = divmod(whole, _DAY)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = zip((days, hours, minutes, secs), "dhms", strict=True)
    return " ".join(f"{count}{unit}" for count, unit in parts if count)


def readable_elapsed(value: float | None) -> str:
    """How long something has lasted (a lock held), in whole seconds, as :func:`readable` says
    it (``"7s"``, ``"1h 2m 7s"``); ``"?"`` when unknown. The admin and ``redis_locks`` agree."""
    if value is None:
        return "?"
    return readable(max(0, round(value)))


def _significant(value: float) -> str:
    """``value`` with three significant digits below 1000 (two decimals at most), and no
    trailing zeros: 2.50 is "2.5", 30.0 is "30"."""
    text = f"{value:.{2 if value < 10 else 1 if value < 100 else 0}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
