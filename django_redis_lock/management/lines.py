"""What ``manage.py redis_locks`` prints: columns, ages, and its ``semaphores`` and
``release-permit`` actions (kept apart so that the command stays one page;
``semaphore_registry.py`` reads Redis)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone

from django.core.management.base import CommandError

from .. import semaphore_registry
from ..records import LockInfo


def age(info: LockInfo) -> str:
    """Seconds since ``info``'s holder took it ("?": unknown)."""
    if info.acquired_at is None:
        return "?"
    return f"{max((datetime.now(timezone.utc) - info.acquired_at).total_seconds(), 0):.0f}s"


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """``rows`` under ``header``, in columns as wide as their widest cell."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def semaphores(name: str | None, match: str | None, as_json: bool) -> tuple[list[str], str]:
    """The lines for stdout, and a note for stderr ('' none): every semaphore with a permit
    held (``name`` None), or the holders of one."""
    if name is not None:
        info = semaphore_registry.get_semaphore(name)
        if info is None:
            raise CommandError(f"No permit of a semaphore named {name!r} is held.")
        if as_json:
            return [json.dumps(info.as_dict(), indent=2, sort_keys=True)], ""
        holders = [
            (holder.token, holder.label or "", holder.holder, age(holder), f"{holder.ttl:.1f}s")
            for holder in info.holders
        ]
        summary = f"{info.name}: {len(info.holders)} of {info.limit} held, {info.waiting} waiting"
        return [summary, *table(("TOKEN", "LABEL", "HOLDER", "AGE", "TTL"), holders)], ""
    found = sorted(semaphore_registry.iter_semaphores(match=match), key=lambda info: info.name)
    if as_json:
        return [json.dumps([info.as_dict() for info in found], indent=2, sort_keys=True)], ""
    rows = [
        (info.name, f"{len(info.holders)}/{info.limit}", str(info.waiting),
         ", ".join(sorted({holder.label for holder in info.holders if holder.label})))
        for info in found
    ]  # fmt: skip
    lines = table(("NAME", "HELD", "WAITING", "LABELS"), rows)
    return lines, "" if rows else "No semaphore has a permit held."


def release_permit(name: str, token: str, by: str) -> str:
    """Force-release one permit; the line to print, or ``CommandError`` when nothing was."""
    if not semaphore_registry.force_release_permit(name, token, by=by):
        raise CommandError(
            f"Not released: no permit of {name!r} is held with token {token} (it was given "
            "back or its lease ended). Nothing was freed."
        )
    return f"Released a permit of {name!r}; the first waiter, if any, has it now."
