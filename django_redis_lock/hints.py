"""Arguments people bring from other lock libraries, and what ours are called.

``Lock("x", blocking_timeout=5)`` would otherwise fail with Python's bare "Lock.__init__() got
an unexpected keyword argument", naming a method the caller never wrote when they used
``@lock``. Every public entry point that takes options checks them here first and says which
of ours is meant.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

__all__ = ["FAMILIAR", "check_names", "hinted", "keyword_names"]

P = ParamSpec("P")
R = TypeVar("R")

# Their name -> (ours, the first that the callee takes; or none) and why.
FAMILIAR: dict[str, tuple[tuple[str, ...], str]] = {
    "blocking_timeout": (("wait",), "seconds to wait for the lock; redis-py's blocking_timeout"),
    "blocking": (("wait",), "wait=0 does not block; redis-py's blocking=False"),
    "expire": (("timeout", "ttl"), "seconds; python-redis-lock's expire"),
    "ttl": (("timeout",), "the lease, in seconds"),
    "lease": (("timeout", "ttl"), "the lease, in seconds"),
    "auto_renewal": (("auto_renew",), "python-redis-lock's auto_renewal"),
    "sleep": ((), "waiters are woken in turn, they do not poll (redis-py's sleep)"),
    "thread_local": ((), "a hold belongs to the thread or asyncio task that took it"),
    "id": ((), "the owner token is random, per acquisition (python-redis-lock's id)"),
    "method": (("methods",), "django-ratelimit's method"),
    "block": ((), "a duplicate submission gets 409, or waits up to wait= seconds"),
    "rate": ((), "this is a lock, not a rate limiter"),
    # Task-uniqueness libraries (celery-once's QueueOnce, celery-singleton's Singleton).
    "once": (
        (),
        "celery-once's options are ours: guard='until_executed', guard_key= for its keys, "
        "on_duplicate='skip' for graceful, guard_queued_timeout= for its timeout",
    ),
    "unique_on": (("guard_key",), "celery-singleton's unique_on, as a template or callable"),
    "lock_expiry": (("guard_queued_timeout",), "celery-singleton's lock_expiry, in seconds"),
    "raise_on_duplicate": (("on_duplicate",), "on_duplicate='raise'"),
    "graceful": (("on_duplicate",), "celery-once's graceful: on_duplicate='skip'"),
    "keys": (("guard_key",), "celery-once's keys, as a template or callable"),
}


def check_names(given: Iterable[str], called: str, takes: Iterable[str] = ()) -> None:
    """Raise ``TypeError`` for a keyword in ``given`` that is another library's name for one of
    ours, or (when ``takes`` is given) that is not among ``takes`` at all, naming ``called``
    (what the caller wrote, e.g. ``"@lock()"``)."""
    # Called on every Lock(): no copy of a frozenset, and nothing but a lookup per name given.
    accepted = takes if isinstance(takes, frozenset) else frozenset(takes)
    for name in given:
        if name in accepted:
            continue
        unexpected = f"{called} got an unexpected keyword argument {name!r}"
        if name in FAMILIAR:
            candidates, why = FAMILIAR[name]
            ours = next((c for c in candidates if not accepted or c in accepted), None)
            if ours is not None:
                raise TypeError(f"{unexpected}: use {ours}= ({why}).")
            if not candidates:
                raise TypeError(f"{unexpected}: there is none here, {why}.")
        if accepted:
            options = ", ".join(f"{option}=" for option in sorted(accepted))
            raise TypeError(f"{unexpected}; it takes {options}.")


def hinted(func: Callable[P, R]) -> Callable[P, R]:
    """``func``, whose keyword arguments are checked by :func:`check_names` first, against
    the ones it takes (its signature, as type checkers see it, is kept)."""
    called = f"{func.__name__}()"
    takes = keyword_names(func)

    @functools.wraps(func)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        check_names(kwargs, called, takes)
        return func(*args, **kwargs)

    return checked


def keyword_names(func: Callable[..., Any]) -> frozenset[str]:
    """The keyword arguments ``func`` takes (for ``check_names(takes=...)``)."""
    code = func.__code__
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return frozenset(names[1:] if names and names[0] == "self" else names)
