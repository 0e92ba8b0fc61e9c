"""Decorators built on :class:`~django_redis_lock.Lock`:

- ``@lock(name, **options)``: any function, sync or async;
- ``@locked_method(suffix=None, refresh=True, **options)``: a model method, on its row's lock;

and the pieces other decorators share (``name_maker``, ``held_each_call``, ``template_group``).
``@prevent_double_submit`` is in ``double_submit.py``.

``@lock(name, **options)`` holds a fresh ``Lock`` for each call of the decorated function (sync
or async). ``name`` is a plain string, a ``str.format`` template filled from the call's
arguments (``"import:{feed_id}"`` or ``"import:{0}"``), or a callable given the call's
arguments and returning the name. When the lock cannot be had within ``wait``, the call raises
``LockNotAcquired`` and the function does not run.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction

from ..exceptions import LockError, LockLost, LockNotOwned
from ..hints import check_names
from ..primitives.lock import LOCK_OPTIONS, Lock
from ..primitives.semaphore import SEMAPHORE_OPTIONS, Semaphore
from .transactions import release_after_transaction

__all__ = [
    "held_each_call",
    "lock",
    "locked_method",
    "name_maker",
    "semaphore",
    "template_group",
]

F = TypeVar("F", bound=Callable[..., Any])


def name_maker(name: str | Callable[..., str], func: Callable[..., Any]) -> Callable[..., str]:
    """A function of a call's arguments giving a name: ``name`` itself if callable, else the
    ``str.format`` template ``name`` filled from the bound arguments (or the plain string)."""
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


def template_group(name: str | Callable[..., str]) -> str | None:
    """The metrics group a decorator's locks share unless ``group=`` says another: the
    template ``name`` itself (``"sync:{customer_id}"``: one label, whatever the ids); None
    for a plain name or a callable (the name's own fallback, ``core/labels.py``)."""
    return name if isinstance(name, str) and "{" in name else None


def lock(name: str | Callable[..., str], **options: Any) -> Callable[[F], F]:
    """Run each call of the decorated function while holding the lock ``name``.

    ``options`` are those of :class:`Lock` (``timeout``, ``wait``, ``label``, ...); they are
    checked when the decorator is applied, not at the first call. A template ``name`` is the
    locks' metrics group unless ``group=`` says another.
    """
    check_names(options, "@lock()", takes=LOCK_OPTIONS)
    options.setdefault("group", template_group(name))
    Lock("validate-options", **options)  # bad options fail at import time, not at run time
    return held_each_call(name, functools.partial(Lock, **options))


def held_each_call(
    name: str | Callable[..., str], primitive: Callable[[str], Any]
) -> Callable[[F], F]:
    """A decorator that holds ``primitive(name)`` (a ``Lock`` or ``Semaphore`` factory) for
    each call of the decorated function, sync or async; ``name`` as for :func:`lock`."""

    def decorator(func: F) -> F:
        make_name = name_maker(name, func)

        if iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with primitive(make_name(*args, **kwargs)):
                    return await func(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with primitive(make_name(*args, **kwargs)):
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
    check_names(options, "@locked_method()", takes=LOCK_OPTIONS)
    Lock("validate-options", **options)

    def decorator(method: F) -> F:
        if iscoroutinefunction(method):
            raise TypeError(
                f"@locked_method does not support async methods ({method.__qualname__}); "
                "use `async with self.lock(...)` in it instead."
            )

        @functools.wraps(method)
        def wrapper(instance: Any, *args: Any, **kwargs: Any) -> Any:
            row_lock = instance.lock(suffix, **options)
            database = instance._lock_database()
            row_lock.__enter__()  # raises LockNotAcquired with the holder when it must
            try:
                if refresh:
                    instance.refresh_from_db(using=database)
                result = method(instance, *args, **kwargs)
            except BaseException:
                # The method's own error is the one to see; a lost lock was already reported.
                with contextlib.suppress(LockError):
                    release_after_transaction(row_lock, using=database)
                raise
            try:
                release_after_transaction(row_lock, using=database)
            except LockNotOwned as not_owned:
                raise LockLost(
                    f"The lock of {instance!r} was lost while {method.__qualname__} ran: its "
                    "writes may have overlapped another holder's.",
                    name=row_lock.name,
                ) from not_owned
            return result

        return wrapper  # type: ignore[return-value]

    return decorator


def semaphore(name: str | Callable[..., str], *, limit: int, **options: Any) -> Callable[[F], F]:
    """Run each call of the decorated function (sync or async) holding a permit of semaphore
    ``name``: a plain string, a ``str.format`` template over the call's arguments, or a
    callable (as ``@lock``'s). ``options`` are :class:`Semaphore`'s, checked when the
    decorator is applied. Raises ``LockNotAcquired`` when no permit frees within ``wait``."""
    check_names(options, "@semaphore()", takes=SEMAPHORE_OPTIONS)
    Semaphore("validate-options", limit=limit, **options)
    options.setdefault("group", template_group(name))
    return held_each_call(name, functools.partial(Semaphore, limit=limit, **options))
