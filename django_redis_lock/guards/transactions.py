"""Releasing a lock when the transaction its writes were made in ends, not before: the next
holder must read committed rows (``@locked_method``, ``LockableModelMixin``)."""

from __future__ import annotations

import contextlib
import weakref

from django.db import transaction

from ..exceptions import LockBackendError, LockNotOwned
from ..primitives.lock import Lock

__all__ = ["release_after_transaction"]


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
