"""``run_once``: process a message or job at most once within a time window.

    @run_once("invoice-email:{invoice_id}", ttl=24 * 3600)
    def send_invoice_email(invoice_id): ...      # a second delivery returns None

    with run_once(f"webhook:{event_id}", ttl=3600) as first:
        if first:
            handle(event)

The first caller takes a lock named ``once:<key>`` and runs; when it finishes without raising, a
"done" mark is left for ``ttl`` seconds, written by the same script that releases the lock. A
duplicate that arrives meanwhile waits (up to ``wait``) for the first and then sees the mark; one
that arrives later sees it at once. If the first caller raises (or dies), nothing is marked, and
the next delivery processes the message: at most once while it succeeds, never zero times.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction

from .exceptions import LockBackendError, LockNotOwned
from .lock import Lock

__all__ = ["run_once"]

F = TypeVar("F", bound=Callable[..., Any])

_DONE = b"done"


class run_once:  # lower case: it is used like a function (decorator, context manager)
    """At most once per ``key`` within ``ttl`` seconds; see the module docstring."""

    def __init__(
        self,
        key: str | Callable[..., str],
        ttl: float,
        *,
        wait: float | None = None,
        using: str | None = None,
    ) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0:
            raise ValueError(f"ttl must be a positive number of seconds, not {ttl!r}.")
        if not callable(key) and not (isinstance(key, str) and key):
            raise TypeError("key must be a non-empty string, a template, or a callable.")
        Lock("validate-options", wait=wait, using=using)
        self.key = key
        self.ttl = float(ttl)
        self.wait = wait
        self.using = using
        self._lock: Lock | None = None

    def _lock_for(self, key: str) -> Lock:
        return Lock(f"once:{key}", wait=self.wait, using=self.using, label=f"run once: {key}")

    # -- context manager -------------------------------------------------------------------

    def __enter__(self) -> bool:
        if not isinstance(self.key, str):
            raise TypeError("As a context manager, run_once needs the key itself, a string.")
        lock = self._lock_for(self.key)
        ctx = lock._begin(None, want_result=True)
        if lock._acquire(ctx):
            self._lock = lock
            return True
        if ctx.result is None:
            raise lock._not_acquired(ctx)  # the first one is still running after `wait`
        return False

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        lock, self._lock = self._lock, None
        if lock is None:
            return
        # Marked done only when the work succeeded: a failure leaves it to the next delivery.
        done = _DONE if exc_type is None else None
        with contextlib.suppress(LockNotOwned, LockBackendError):
            lock._release_call(done, self.ttl).run()

    # -- decorator ---------------------------------------------------------------------------

    def __call__(self, func: F) -> F:
        from .decorators import _name_maker

        make_key = _name_maker(self.key, func)

        if iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_once(*args: Any, **kwargs: Any) -> Any:
                lock = self._lock_for(make_key(*args, **kwargs))
                ctx = lock._begin(None, want_result=True)
                if not await lock._aacquire(ctx):
                    if ctx.result is None:
                        raise lock._not_acquired(ctx)
                    return None
                done = None
                try:
                    result = await func(*args, **kwargs)
                    done = _DONE
                    return result
                finally:
                    with contextlib.suppress(LockNotOwned, LockBackendError):
                        await lock._release_call(done, self.ttl).arun()

            return async_once  # type: ignore[return-value]

        @functools.wraps(func)
        def once(*args: Any, **kwargs: Any) -> Any:
            with type(self)(
                make_key(*args, **kwargs), self.ttl, wait=self.wait, using=self.using
            ) as first:
                return func(*args, **kwargs) if first else None

        return once  # type: ignore[return-value]
