"""Decorators built on :class:`~django_redis_lock.Lock`.

``@lock(name, **options)`` holds a fresh ``Lock`` for each call of the decorated function (sync
or async). ``name`` is a plain string, a ``str.format`` template filled from the call's
arguments (``"import:{feed_id}"`` or ``"import:{0}"``), or a callable given the call's
arguments and returning the name. When the lock cannot be had within ``wait``, the call raises
``LockNotAcquired`` and the function does not run.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction

from .lock import Lock

__all__ = ["lock", "locked_method"]

F = TypeVar("F", bound=Callable[..., Any])


def _name_maker(name: str | Callable[..., str], func: Callable[..., Any]) -> Callable[..., str]:
    if callable(name):
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"lock() needs a name, a template or a callable, not {type(name).__name__}."
        )
    if "{" not in name:
        return lambda *args, **kwargs: name
    signature = inspect.signature(func)

    def from_template(*args: Any, **kwargs: Any) -> str:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return name.format(*bound.args, **bound.arguments)

    return from_template


def lock(name: str | Callable[..., str], **options: Any) -> Callable[[F], F]:
    """Run each call of the decorated function while holding the lock ``name``.

    ``options`` are those of :class:`Lock` (``timeout``, ``wait``, ``label``, ...); they are
    checked when the decorator is applied, not at the first call.
    """
    Lock("validate-options", **options)  # bad options fail at import time, not at run time

    def decorator(func: F) -> F:
        make_name = _name_maker(name, func)

        if iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with Lock(make_name(*args, **kwargs), **options):
                    return await func(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Lock(make_name(*args, **kwargs), **options):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


def locked_method(
    suffix: str | None = None, *, refresh: bool = True, **options: Any
) -> Callable[[F], F]:
    """Hold the row's lock (``self.lock(suffix, **options)``) for each call of a model method.

    The instance's class must use :class:`~django_redis_lock.LockableModelMixin`. With
    ``refresh`` the instance is reloaded from the database once the lock is held, so a
    read-modify-write inside sees what the previous holder committed. Inside
    ``transaction.atomic`` the lock is kept until the transaction commits (or rolls back).
    Raises ``LockNotAcquired`` when the lock cannot be had within ``wait``.
    """
    Lock("validate-options", **options)

    def decorator(method: F) -> F:
        if iscoroutinefunction(method):
            raise TypeError(
                f"@locked_method does not support async methods ({method.__qualname__}); "
                "use `async with self.lock(...)` in it instead."
            )

        @functools.wraps(method)
        def wrapper(instance: Any, *args: Any, **kwargs: Any) -> Any:
            from .mixins import release_after_transaction

            row_lock = instance.lock(suffix, **options)
            database = instance._lock_database()
            row_lock.__enter__()  # raises LockNotAcquired with the holder when it must
            try:
                if refresh:
                    instance.refresh_from_db(using=database)
                return method(instance, *args, **kwargs)
            finally:
                release_after_transaction(row_lock, using=database)

        return wrapper  # type: ignore[return-value]

    return decorator
