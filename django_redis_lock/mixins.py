"""``LockableModelMixin``: a lock per model row, across processes and hosts.

    class Account(LockableModelMixin, models.Model):
        balance = models.DecimalField(...)

        @locked_method()
        def withdraw(self, amount):        # the row is reloaded after the lock is taken
            self.balance -= amount
            self.save()

    with account.lock(suffix="statement", timeout=60):
        ...

The lock of a row is named ``<app_label>.<model_name>:<pk>[:<suffix>]`` and is re-entrant by
default, so a locked method may call another locked method of the same row.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from django.db import router, transaction

from .exceptions import LockBackendError, LockNotOwned
from .hints import check_names
from .primitives.group import GROUP_OPTIONS, LockGroup, lock_many
from .primitives.lock import LOCK_OPTIONS, Lock

__all__ = ["LockableModelMixin", "PreventDoubleSubmitMixin", "release_after_transaction"]


class LockableModelMixin:
    """Give model instances ``lock()``, and the model ``lock_many(rows)``; use it with
    :func:`~django_redis_lock.locked_method`."""

    def get_lock_name(self, suffix: str | None = None) -> str:
        """The lock name of this row; override to share one lock between rows, say."""
        if self.pk is None:  # type: ignore[attr-defined]
            raise ValueError(
                f"{type(self).__name__} instance has no primary key yet: save it before locking "
                "it (an unsaved row has no name other processes could agree on)."
            )
        label = self._meta.label_lower  # type: ignore[attr-defined]
        tag = self.get_lock_hash_tag()
        name = f"{label}:{{{tag}}}:{self.pk}" if tag else f"{label}:{self.pk}"  # type: ignore[attr-defined]
        return f"{name}:{suffix}" if suffix else name

    def get_lock_hash_tag(self) -> str | None:
        """A Redis hash tag for this row's lock (None: none, the default). Rows whose locks
        share a tag (``f"bank-{self.bank_id}"``: the accounts of one bank) are in one Redis
        Cluster slot, so ``lock_many`` takes them in one round trip there too (on one server it
        always does). It changes the rows' lock names: change it only with every process of
        the site stopped, or two processes would lock one row under two names."""
        return None

    def lock(self, suffix: str | None = None, **options: Any) -> Lock:
        """A :class:`~django_redis_lock.Lock` for this row (re-entrant unless told otherwise)."""
        check_names(options, "lock()", takes=LOCK_OPTIONS)
        options.setdefault("reentrant", True)
        options.setdefault("label", f"{type(self).__name__} {self.pk}")  # type: ignore[attr-defined]
        options.setdefault("group", self._lock_group(suffix))
        return Lock(self.get_lock_name(suffix), **options)

    @classmethod
    def lock_many(
        cls, rows: Iterable[LockableModelMixin], suffix: str | None = None, **options: Any
    ) -> LockGroup:
        """The locks of ``rows`` (any lockable rows, at least one), held together: all or
        nothing, in one order whatever order ``rows`` come in
        (:func:`~django_redis_lock.lock_many`).
        Re-entrant unless told otherwise, like :meth:`lock`: a row this thread holds already
        is entered again."""
        check_names(options, "lock_many()", takes=GROUP_OPTIONS)
        if isinstance(rows, LockableModelMixin) or not isinstance(rows, Iterable):
            raise TypeError(f"lock_many() takes an iterable of rows, not {type(rows).__name__}.")
        rows = list(rows)
        for row in rows:
            if not isinstance(row, LockableModelMixin):
                raise TypeError(
                    f"lock_many() takes rows of models with LockableModelMixin, not "
                    f"{type(row).__name__}."
                )
        options.setdefault("reentrant", True)
        # One label for every member (each lock's name has its row's pk): the same size
        # however many rows.
        options.setdefault("label", f"{cls.__name__} rows, taken together")
        if rows:
            options.setdefault("group", rows[0]._lock_group(suffix))
        return lock_many([row.get_lock_name(suffix) for row in rows], **options)

    def _lock_group(self, suffix: str | None) -> str:
        """The metrics' group of this model's row locks: ``model:<label>[:<suffix>]``."""
        group = f"model:{self._meta.label_lower}"  # type: ignore[attr-defined]
        return f"{group}:{suffix}" if suffix else group

    def _lock_database(self) -> str:
        return self._state.db or router.db_for_write(type(self), instance=self)  # type: ignore[attr-defined,arg-type]


class _ReleaseOnCommit:
    """The on_commit callback. Django drops it unrun when the transaction (or the savepoint it
    was registered in) rolls back; a finalizer then releases the lock all the same."""

    def __init__(self, lock: Lock, state: dict[str, bool]) -> None:
        self.lock = lock
        self.state = state

    def __call__(self) -> None:
        _release_once(self.lock, self.state)


def _release_once(lock: Lock, state: dict[str, bool]) -> None:
    if state["released"]:
        return
    state["released"] = True
    # Lost meanwhile (reported when it was lost), or Redis unreachable (the lease ends by itself).
    with contextlib.suppress(LockNotOwned, LockBackendError):
        lock.release()


def release_after_transaction(lock: Lock, using: str | None = None) -> None:
    """Release ``lock`` now, or, inside ``transaction.atomic``, when the transaction ends.

    The writes made under the lock are only visible to the next holder once they are committed:
    releasing before would let it read stale rows. On commit the lock is released after the
    commit; on rollback (of the transaction, or of the savepoint the writes were in) as soon as
    the writes are gone.
    """
    if not transaction.get_connection(using).in_atomic_block:
        lock.release()
        return
    state = {"released": False}
    callback = _ReleaseOnCommit(lock, state)
    # Not a reference to the callback: the finalizer must not keep it alive.
    weakref.finalize(callback, _release_once, lock, state)
    transaction.on_commit(callback, using=using)


class PreventDoubleSubmitMixin:
    """``@prevent_double_submit`` for a class-based view (sync or async):

        class CheckoutView(PreventDoubleSubmitMixin, FormView):
            double_submit = {"key": "user", "hold": 10}

    ``double_submit`` holds the decorator's options; the group defaults to the view class's
    dotted name. Safe methods pass through as with the decorator.
    """

    double_submit: ClassVar[dict[str, Any]] = {}

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        guarded = type(self).__dict__.get("_guarded_dispatch")
        if guarded is None:
            guarded = self._guard_dispatch()
            type.__setattr__(type(self), "_guarded_dispatch", guarded)
        return guarded(request, *args, view=self, **kwargs)

    @classmethod
    def _guard_dispatch(cls) -> Callable[..., Any]:
        from .guards.double_submit import prevent_double_submit

        options = {"group": f"{cls.__module__}.{cls.__qualname__}", **cls.double_submit}

        if getattr(cls, "view_is_async", False):

            async def dispatch_async(request: Any, *args: Any, view: Any, **kwargs: Any) -> Any:
                parent = super(PreventDoubleSubmitMixin, view)
                return await parent.dispatch(request, *args, **kwargs)  # type: ignore[attr-defined]

            return prevent_double_submit(**options)(dispatch_async)

        def dispatch(request: Any, *args: Any, view: Any, **kwargs: Any) -> Any:
            return super(PreventDoubleSubmitMixin, view).dispatch(request, *args, **kwargs)  # type: ignore[misc]

        return prevent_double_submit(**options)(dispatch)
