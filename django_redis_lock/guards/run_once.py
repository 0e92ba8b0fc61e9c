"""``run_once``: process a message or job at most once within a time window.

    @run_once("invoice-email:{invoice_id}", ttl=24 * 3600)
    def send_invoice_email(invoice_id): ...      # a second delivery returns None

    with run_once(f"webhook:{event_id}", ttl=3600) as first:   # or `async with`
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
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from asgiref.sync import iscoroutinefunction

from ..core import durations
from ..exceptions import LockBackendError, LockNotOwned
from ..hints import check_names, keyword_names
from ..primitives.lock import Claim, Lock
from .decorators import name_maker

__all__ = ["run_once"]

P = ParamSpec("P")
R = TypeVar("R")

_DONE = b"done"


class run_once:  # lower case: it is used like a function (decorator, context manager)
    """At most once per ``key`` within ``ttl`` seconds; see the module docstring."""

    def __new__(cls, *args: Any, **kwargs: Any) -> run_once:
        check_names(kwargs, "run_once()", takes=_OPTIONS)
        return super().__new__(cls)

    def __init__(
        self,
        key: str | Callable[..., str],
        ttl: float,
        *,
        wait: float | None = None,
        using: str | None = None,
    ) -> None:
        ttl = durations.seconds(ttl, "ttl")
        if not callable(key) and not (isinstance(key, str) and key):
            raise TypeError("key must be a non-empty string, a template, or a callable.")
        Lock("validate-options", wait=wait, using=using)
        self.key = key
        self.ttl = ttl
        self.wait = wait
        self.using = using
        self._lock: Lock | None = None

    def _lock_for(self, key: str) -> Lock:
        return Lock(f"once:{key}", wait=self.wait, using=self.using, label=f"run once: {key}")

    # -- context manager (sync and async) -------------------------------------------------

    def _lock_of_key(self) -> Lock:
        if not isinstance(self.key, str):
            raise TypeError("As a context manager, run_once needs the key itself, a string.")
        return self._lock_for(self.key)

    def _claimed(self, lock: Lock, claim: Claim) -> bool:
        """True: run the work. False: it was done already. Raises when it is still running
        elsewhere after ``wait``."""
        if claim.acquired:
            self._lock = lock
            return True
        if claim.result is None:
            assert claim.refusal is not None
            raise claim.refusal
        return False

    def _finishing(self, exc_type: type[BaseException] | None) -> tuple[Lock | None, bytes | None]:
        # Marked done only when the work succeeded: a failure leaves it to the next delivery.
        lock, self._lock = self._lock, None
        return lock, (_DONE if exc_type is None else None)

    def __enter__(self) -> bool:
        lock = self._lock_of_key()
        return self._claimed(lock, lock.claim(want_result=True))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        lock, result = self._finishing(exc_type)
        if lock is not None:
            with contextlib.suppress(LockNotOwned, LockBackendError):
                lock.release(result=result, result_ttl=self.ttl)

    async def __aenter__(self) -> bool:
        lock = self._lock_of_key()
        return self._claimed(lock, await lock.aclaim(want_result=True))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        lock, result = self._finishing(exc_type)
        if lock is not None:
            with contextlib.suppress(LockNotOwned, LockBackendError):
                await lock.arelease(result=result, result_ttl=self.ttl)

    # -- decorator ---------------------------------------------------------------------------

    @overload
    def __call__(
        self, func: Callable[P, Coroutine[Any, Any, R]]
    ) -> Callable[P, Coroutine[Any, Any, R | None]]: ...

    @overload
    def __call__(self, func: Callable[P, R]) -> Callable[P, R | None]: ...

    def __call__(self, func: Callable[P, Any]) -> Callable[P, Any]:
        """The decorated function runs once per key within ``ttl``; a duplicate call returns
        None (its type says so: ``R | None``)."""
        make_key = name_maker(self.key, func)

        def for_call(*args: Any, **kwargs: Any) -> run_once:
            return type(self)(
                make_key(*args, **kwargs), self.ttl, wait=self.wait, using=self.using
            )

        if iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_once(*args: P.args, **kwargs: P.kwargs) -> Any:
                async with for_call(*args, **kwargs) as first:
                    return await func(*args, **kwargs) if first else None

            return async_once

        @functools.wraps(func)
        def once(*args: P.args, **kwargs: P.kwargs) -> Any:
            with for_call(*args, **kwargs) as first:
                return func(*args, **kwargs) if first else None

        return once


# What run_once() takes (checked on every construction: one per decorated call).
_OPTIONS = keyword_names(run_once.__init__)
