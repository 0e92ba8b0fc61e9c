"""Fenced writes: a holder whose lease was lost cannot overwrite newer work.

A process can pause (a GC pause, a stopped VM) for longer than its lease; another process then
takes the lock and writes; the first one wakes up and, believing it still holds the lock, writes
over the newer data. A lock alone cannot stop that (Kleppmann). The storage can: each
acquisition of a ``fencing=True`` lock gets a larger ``fencing_token``, the row keeps the token
of its last write, and a write with a smaller token is refused.

    class Document(LockableModelMixin, models.Model):
        body = models.TextField()
        fencing_token = models.BigIntegerField(null=True, editable=False)

    with doc.lock(fencing=True) as held:
        if not fenced_update(Document.objects.filter(pk=doc.pk), held.fencing_token, body=text):
            raise LockLost("a newer holder has written this row")
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

__all__ = ["fenced_update"]


def fenced_update(
    queryset: QuerySet[Any], fencing_token: int, *, field: str = "fencing_token", **values: Any
) -> int:
    """``queryset.update(**values)`` on the rows whose ``field`` is lower than ``fencing_token``
    (or empty), storing the token in ``field``; returns how many rows were updated.

    One ``UPDATE ... WHERE`` statement, so the check and the write cannot be split by another
    writer. 0 means every row had a newer (or equal) token: our lease was lost meanwhile.
    """
    if isinstance(fencing_token, bool) or not isinstance(fencing_token, int):
        raise TypeError(
            f"fencing_token must be the int from Lock.fencing_token (use fencing=True), "
            f"not {fencing_token!r}."
        )
    newer_than_stored = Q(**{f"{field}__lt": fencing_token}) | Q(**{f"{field}__isnull": True})
    updated: int = queryset.filter(newer_than_stored).update(**values, **{field: fencing_token})
    return updated
