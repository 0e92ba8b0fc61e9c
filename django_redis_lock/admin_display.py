"""How the admin Locks pages show what they read: durations, ages, the list's orders, the
query strings of their links, and how a link or form names the lease it releases (``admin.py``
has the views)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote, urlencode

from django.http import HttpRequest
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from .core.durations import readable, readable_elapsed
from .registry.census import Entry
from .registry.records import LockInfo

__all__ = [
    "LIST_ORDERS",
    "breakable",
    "entry_rows",
    "lease_from_reference",
    "lease_reference",
    "query_string",
    "refresh_seconds",
]

# How the list's rows may be ordered (within the page: SCAN pages come in no order).
LIST_ORDERS: dict[str, Callable[[LockInfo], Any]] = {
    "name": lambda info: info.name,
    "waiting": lambda info: (-info.waiting, info.name),
    "ttl": lambda info: (info.ttl, info.name),
}


def refresh_seconds(request: HttpRequest, default: int) -> int:
    """Seconds between reloads asked for with ``?refresh=`` (``off``: 0), else ``default``."""
    value = request.GET.get("refresh", "")
    if value == "off":
        return 0
    return min(int(value), 3600) if value.isdigit() and int(value) > 0 else default


def query_string(**params: Any) -> str:
    """A query string of the ``params`` that have a value."""
    return "?" + urlencode({key: value for key, value in params.items() if value})


def entry_rows(entries: list[Entry]) -> list[tuple[Entry, str, str, SafeString]]:
    """Each entry with how long it has been held, how long its lease has left, as text, and
    its name as the page shows it (:func:`breakable`)."""
    return [
        (entry, readable_elapsed(entry.held_for),
         "never" if entry.ends_in == math.inf else readable(entry.ends_in), breakable(entry.name))
        for entry in entries
    ]  # fmt: skip


# The ends of a name's parts (``report:nightly``, ``shop.tasks.sync``, ``a/b``): where a name
# wraps when its column is narrower, rather than inside a part (``dem|o:con|tenti|on``).
_PART_END = re.compile(r"(?<=[:./])")
# Past this many characters a name is cut on the lists (whole in its link's title).
NAME_SHOWN = 120


def breakable(name: str) -> SafeString:
    """``name`` as the lists show it: cut past :data:`NAME_SHOWN` characters, escaped, with a
    line-break opportunity (``<wbr>``) after each separator of its parts."""
    parts = _PART_END.split(Truncator(name).chars(NAME_SHOWN))
    return mark_safe("<wbr>".join(escape(part) for part in parts))  # each part escaped


def lease_reference(token: str, name: str) -> str:
    """How the release links and forms name one lease (a lock's, or a semaphore's permit):
    ``<token>:<name>`` with the token percent-encoded. An encoded token has no ``:``, so the
    first one ends it, whatever the name holds; a job's token carries the job's id, and ids
    such as ``rq:job:42`` have colons, as names do."""
    return f"{quote(token, safe='')}:{name}"


def lease_from_reference(value: str) -> tuple[str, str]:
    """``(token, name)`` from a :func:`lease_reference`; ``ValueError`` for a value it did not
    write (no colon, an empty token or name, a token not encoded as it encodes one)."""
    quoted, colon, name = value.partition(":")
    token = unquote(quoted, errors="strict") if colon and quoted and name else ""
    if not token or quote(token, safe="") != quoted:
        raise ValueError(f"not a lease reference: {value!r}")
    return token, name
