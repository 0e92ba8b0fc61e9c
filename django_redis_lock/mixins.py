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
from typing import Any

from django.db import router, transaction

from .exceptions import LockBackendError, LockNotOwned
from .lock import Lock

__all__ = ["LockableModelMixin", "release_after_transaction"]


class LockableModelMixin:
    """Give model instances ``lock()``; use it with :func:`~django_redis_lock.locked_method`."""

    def get_lock_name(self, suffix: str | None = None) -> str:
        """The lock name of this row; override to share one lock between rows, say."""
        if self.pk is None:  # type: ignore[attr-defined]
            raise ValueError(
                f"{type(self).__name__} instance has no primary key yet: save it before locking "
                "it (an unsaved row has no name other processes could agree on)."
            )
        name = f"{self._meta.label_lower}:{self.pk}"  # type: ignore[attr-defined]
        return f"{name}:{suffix}" if suffix else name

    def lock(self, suffix: str | None = None, **options: Any) -> Lock:
        """A :class:`~django_redis_lock.Lock` for this row (re-entrant unless told otherwise)."""
        options.setdefault("reentrant", True)
        options.setdefault("label", f"{type(self).__name__} {self.pk}")  # type: ignore[attr-defined]
        return Lock(self.get_lock_name(suffix), **options)

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
