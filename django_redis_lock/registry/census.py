"""What is held and waited for now, read from Redis: one pass of ``SCAN`` over our namespace.

Figures about the present (held, waiting) must come from Redis, not from per-process
counters: under gunicorn or uWSGI each process sees only its own locks, and a process that died
holding one says nothing (django-prometheus #111). So the scrape-time gauges
(``metrics/prometheus.py``, ``metrics/opentelemetry.py``), the admin's pages and
``redis_locks stats`` all take a *census*: one ``SCAN`` with ``MATCH`` on our namespace, each
batch's locks and semaphores read with the admin page's readers (``locks.lease_commands``,
``semaphore.state_commands``) in the round trip of the next ``SCAN``
(``scanning.scan_reading``), and a cap on the keys looked at, so that a scrape stays short on a
Redis with millions of keys (a census cut short says so: ``complete`` is False).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from ..backends import backend_of
from ..backends.scanning import scan_reading
from ..conf import lock_settings
from ..core.labels import MAX_GROUPS, OTHER
from ..core.permits import PermitKeys
from ..primitives.keys import namespace
from ..primitives.semaphore import state_commands, state_from
from .locks import glob_escape, lease_commands, leases_from
from .records import LockInfo, text
from .semaphores import SemaphoreInfo, semaphore_info

__all__ = ["DEFAULT_MAX_KEYS", "Census", "Entry", "GroupFigures", "KindFigures", "take_census"]

# Keys looked at before a census stops: ~1 s of SCAN on a busy server, far past any namespace
# of locks (a lock is 1 to 5 keys).
DEFAULT_MAX_KEYS = 1_000_000
# Keys per SCAN call: sparse locks among many keys need few calls, and each call stays well
# under a millisecond of the (single-threaded) server's time.
_SCAN_COUNT = 2000
_SEMAPHORE_SUFFIX = ":s"


@dataclass(frozen=True)
class Entry:
    """One lock or semaphore held now. ``holders``: 1 for a lock, the permits held for a
    semaphore; ``held_for``: seconds since its oldest holder took it (by that holder's clock);
    ``ends_in``: seconds until the soonest of its leases ends (``math.inf``: never)."""

    kind: str  # "lock" or "semaphore", as the metrics' kind label
    name: str
    group: str
    holders: int
    waiting: int
    held_for: float | None
    ends_in: float
    label: str | None = None
    limit: int | None = None  # a semaphore's


@dataclass(frozen=True)
class GroupFigures:
    held: int  # locks and permits held
    waiting: int


@dataclass(frozen=True)
class KindFigures:
    """Of one kind: ``names`` held (locks; semaphores with a permit held), ``held`` (locks;
    permits) and their ``waiting``."""

    names: int
    held: int
    waiting: int


@dataclass(frozen=True)
class Census:
    """What one census found. ``keys_scanned``: keys of our namespace ``SCAN`` returned;
    ``complete``: False when it stopped at its cap, or could not read a server of a quorum
    (``unreachable``: which, and why)."""

    entries: tuple[Entry, ...]
    keys_scanned: int
    complete: bool
    unreachable: tuple[str, ...] = ()

    @property
    def held(self) -> int:
        return sum(entry.holders for entry in self.entries)

    @property
    def waiting(self) -> int:
        return sum(entry.waiting for entry in self.entries)

    def by_kind(self, contains: str = "") -> dict[str, KindFigures]:
        """``{"lock": ..., "semaphore": ...}``, of the names that contain ``contains``: the
        admin's pages and ``redis_locks stats`` say both, so that a total is never read as
        the locks' alone."""
        return {
            kind: KindFigures(
                len(chosen), sum(e.holders for e in chosen), sum(e.waiting for e in chosen)
            )
            for kind in ("lock", "semaphore")
            for chosen in [[e for e in self.entries if e.kind == kind and contains in e.name]]
        }

    def groups(self, limit: int = MAX_GROUPS) -> dict[tuple[str, str], GroupFigures]:
        """Held and waiting by ``(kind, group)``: the ``limit`` groups with most held, the
        rest summed as ``other`` (label values stay bounded whatever the names)."""
        sums: dict[tuple[str, str], list[int]] = {}
        for entry in self.entries:
            figures = sums.setdefault((entry.kind, entry.group), [0, 0])
            figures[0] += entry.holders
            figures[1] += entry.waiting
        ranked = sorted(sums.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
        kept: dict[tuple[str, str], list[int]] = dict(ranked[:limit])
        for (kind, _), (held, waiting) in ranked[limit:]:
            figures = kept.setdefault((kind, OTHER), [0, 0])
            figures[0] += held
            figures[1] += waiting
        return {key: GroupFigures(held, waiting) for key, (held, waiting) in kept.items()}

    def groups_by_contention(self) -> list[tuple[str, str, GroupFigures]]:
        """:meth:`groups` as ``(kind, group, figures)``, most waiters first, then most held."""
        return sorted(
            ((kind, group, figures) for (kind, group), figures in self.groups().items()),
            key=lambda row: (-row[2].waiting, -row[2].held, row[0], row[1]),
        )

    def most_waited(self, count: int = 10) -> list[Entry]:
        """Those with most waiters now (none without a waiter)."""
        waited = [entry for entry in self.entries if entry.waiting]
        return sorted(waited, key=lambda entry: (-entry.waiting, entry.name))[:count]

    def oldest(self, count: int = 10) -> list[Entry]:
        """Those held longest."""
        aged = [entry for entry in self.entries if entry.held_for is not None]
        return sorted(aged, key=lambda entry: (-(entry.held_for or 0), entry.name))[:count]

    def ending(self, count: int = 10) -> list[Entry]:
        """Those whose lease ends soonest (a holder that stopped renewing shows here)."""
        return sorted(self.entries, key=lambda entry: (entry.ends_in, entry.name))[:count]


def _lock_entry(info: LockInfo, now: float) -> Entry:
    acquired = info.acquired_at.timestamp() if info.acquired_at else None
    return Entry(
        "lock", info.name, info.group, 1, info.waiting,
        max(0.0, now - acquired) if acquired is not None else None, info.ttl, info.label,
    )  # fmt: skip


def _semaphore_entry(info: SemaphoreInfo, now: float) -> Entry:
    since = [holder.acquired_at.timestamp() for holder in info.holders if holder.acquired_at]
    return Entry(
        "semaphore", info.name, info.group, len(info.holders), info.waiting,
        max(0.0, now - min(since)) if since else None,
        min((holder.ttl for holder in info.holders), default=math.inf),
        info.holders[0].label, info.limit,
    )  # fmt: skip


class _Reader:
    """What a census found on one server, batch by batch (``scanning.scan_reading``): the
    commands each batch of keys needs, then the entries from their replies."""

    def __init__(self, seen: set[str], now: float) -> None:
        self.seen, self.now = seen, now
        self.entries: list[Entry] = []
        self.batch: tuple[list[str], list[PermitKeys]] = ([], [])

    def commands_for(self, found: list[Any]) -> list[Any]:
        keys = list(map(text, found))
        leases = [key for key in keys if key.endswith("}") and key not in self.seen]
        self.seen.update(leases)
        layouts = [
            PermitKeys.of(key[: -len(_SEMAPHORE_SUFFIX)])
            for key in keys
            if key.endswith("}" + _SEMAPHORE_SUFFIX)
        ]
        self.batch = leases, layouts
        return [
            *lease_commands(leases),
            *(command for layout in layouts for command in state_commands(layout)),
        ]

    def take(self, found: list[Any], replies: list[Any]) -> None:
        leases, layouts = self.batch
        split = 3 * len(leases)
        self.entries.extend(
            _lock_entry(info, self.now) for info in leases_from(leases, replies[:split])
        )
        replies = replies[split:]
        width = len(replies) // len(layouts) if layouts else 0
        for index, layout in enumerate(layouts):
            try:
                state = state_from(replies[index * width : (index + 1) * width])
            except RedisError:  # a key of ours of another type: not a semaphore of ours
                continue
            info = semaphore_info(layout, state)
            if info is not None:
                self.entries.append(_semaphore_entry(info, self.now))


def take_census(
    *,
    using: str | None = None,
    max_keys: int = DEFAULT_MAX_KEYS,
    clock: Callable[[], float] = time.time,
) -> Census:
    """Every lock and semaphore held now (on a Redis Cluster, every primary; for a quorum,
    each lock once, from the first server that has it). Stops after ``max_keys`` keys of our
    namespace. Raises ``RedisError`` when Redis cannot be read (for a quorum: no server)."""
    if not isinstance(max_keys, int) or isinstance(max_keys, bool) or max_keys < 1:
        raise ValueError(f"max_keys must be a positive int, not {max_keys!r}.")
    alias = using or lock_settings.CACHE_ALIAS
    backend = backend_of(alias)
    pattern = glob_escape(namespace(alias)) + "{*"
    now = clock()
    entries: list[Entry] = []
    seen: set[str] = set()  # a quorum's lock is on several servers: listed once
    unreachable: list[str] = []
    scanned = 0
    complete = True
    targets = backend.servers()
    for target_name, target in targets:
        reader = _Reader(seen, now)
        try:
            found, complete = scan_reading(
                target, pattern, count=min(_SCAN_COUNT, max_keys), max_keys=max_keys - scanned,
                commands_for=reader.commands_for, take=reader.take,
            )  # fmt: skip
        except RedisError as exc:
            if backend.majority is None:  # each key on one server: a census without it is wrong
                raise
            unreachable.append(f"{target_name}: {exc}")
            continue
        scanned += found
        entries.extend(reader.entries)
        if not complete:
            break
    if unreachable:
        if len(unreachable) == len(targets):
            raise RedisError("No server of the quorum could be read: " + "; ".join(unreachable))
        # With a majority read, each lock is on one of them (registry.incomplete).
        complete = complete and backend.incomplete(unreachable) is None
    return Census(tuple(entries), scanned, complete, tuple(unreachable))
