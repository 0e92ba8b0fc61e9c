"""What ``manage.py redis_locks`` prints: columns, ages, and its ``semaphores``,
``release-permit`` and ``stats`` actions (kept apart so that the command stays one page;
``registry/`` reads Redis)."""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError

from ..core.durations import readable, readable_elapsed
from ..registry import semaphores as semaphore_registry
from ..registry.census import Census, Entry

#: The widest a cell is printed: a longer one (a 300-character name) is cut, ending in "…", so
#: that the other columns stay on the terminal. ``show NAME`` and ``--json`` print it whole.
CELL_WIDTH = 48
CUT = "…"


def counted(number: int, noun: str) -> str:
    """``number`` and ``noun``, plural unless it is one: ``1 key``, ``0 keys``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def printable(text: str) -> str:
    """``text`` on one line: a control character (a newline in a name) is escaped, not
    printed, so that it cannot split a row or move the cursor."""
    return "".join(
        char if unicodedata.category(char) != "Cc" else char.encode("unicode_escape").decode()
        for char in text
    )


def cell(text: str) -> str:
    """``text`` as a table prints it: :func:`printable`, and at most :data:`CELL_WIDTH` long."""
    text = printable(text)
    return text if len(text) <= CELL_WIDTH else text[: CELL_WIDTH - len(CUT)] + CUT


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """``rows`` under ``header``, in columns as wide as their widest :func:`cell`."""
    cells = [tuple(cell(text) for text in row) for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]


def cut_any(rows: Sequence[tuple[str, ...]]) -> bool:
    """Whether :func:`table` cuts a cell of ``rows``."""
    return any(len(printable(text)) > CELL_WIDTH for row in rows for text in row)


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
            (
                holder.token,
                holder.label or "",
                holder.holder,
                readable_elapsed(holder.held_for),
                readable(holder.ttl),
            )
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


def _entry_row(entry: Entry) -> tuple[str, ...]:
    held = f"{entry.holders}/{entry.limit}" if entry.limit else str(entry.holders)
    return (
        entry.name, entry.kind, entry.group, held, str(entry.waiting),
        "?" if entry.held_for is None else readable(round(entry.held_for)),
        "never" if entry.ends_in == math.inf else readable(entry.ends_in),
    )  # fmt: skip


def stats(found: Census, top: int) -> list[str]:
    """``redis_locks stats``: totals, held and waiting by group, then the ``top`` locks with
    most waiters, held longest, and ending soonest (the admin's "Hot locks")."""
    cut = ""
    if not found.complete:
        unread = "; ".join(found.unreachable)
        unread = f", and could not read {unread}" if unread else ""
        cut = f" (at least: the census stopped after {counted(found.keys_scanned, 'key')}{unread})"
    # Per kind, as the admin's pages say it: a total alone reads as the locks' own.
    kinds = found.by_kind()
    locks, semaphores = kinds["lock"], kinds["semaphore"]
    printed = [
        f"{found.held} held ({counted(locks.held, 'lock')}, {counted(semaphores.held, 'permit')}"
        f" of {counted(semaphores.names, 'semaphore')}), {found.waiting} waiting"
        f" ({locks.waiting} for locks, {semaphores.waiting} for permits){cut};"
        f" {counted(found.keys_scanned, 'key')} looked at.",
        "",
    ]
    rows = [
        (group, kind, str(f.held), str(f.waiting))
        for kind, group, f in found.groups_by_contention()
    ]
    printed += table(("GROUP", "KIND", "HELD", "WAITING"), rows) if rows else ["Nothing is held."]
    header = ("NAME", "KIND", "GROUP", "HELD", "WAITING", "HELD FOR", "ENDS IN")
    for title, entries in (
        ("Most waiters", found.most_waited(top)),
        ("Held longest", found.oldest(top)),
        ("Ending soonest", found.ending(top)),
    ):
        if entries:
            printed += ["", f"{title}:", *table(header, [_entry_row(e) for e in entries])]
    return printed


def stats_dict(found: Census, top: int) -> dict[str, Any]:
    """``redis_locks stats --json``."""

    def entries(chosen: list[Entry]) -> list[dict[str, Any]]:
        return [
            {
                "name": e.name,
                "kind": e.kind,
                "group": e.group,
                "holders": e.holders,
                "limit": e.limit,
                "waiting": e.waiting,
                "held_for": e.held_for,
                "ends_in": None if e.ends_in == math.inf else round(e.ends_in, 3),
            }
            for e in chosen
        ]

    return {
        "held": found.held,
        "waiting": found.waiting,
        "complete": found.complete,
        "keys_scanned": found.keys_scanned,
        "groups": [
            {"kind": kind, "group": group, "held": f.held, "waiting": f.waiting}
            for (kind, group), f in found.groups().items()
        ],
        "most_waited": entries(found.most_waited(top)),
        "oldest": entries(found.oldest(top)),
        "ending": entries(found.ending(top)),
    }
