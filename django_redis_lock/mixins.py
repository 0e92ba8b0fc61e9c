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

``PreventDoubleSubmitMixin`` and ``release_after_transaction`` are importable from here too, as
they always were (they live with the guards).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import router

from .guards.double_submit import PreventDoubleSubmitMixin
from .guards.transactions import release_after_transaction
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
