"""The one reader of live locks: list them with ``SCAN``, read their records, force-release.

``SCAN`` with ``MATCH`` limited to our key namespace, never ``KEYS``, and never every key in
memory: each ``SCAN`` batch's records and TTLs are read in one pipelined round trip and yielded.
A lock that expires between the ``SCAN`` and the read is skipped; a key in our namespace
without a readable owner record is shown as such (``LockInfo.valid`` is False), not a crash.

Only the lease keys (``...{tag}``) are listed, not their siblings (queue, wake-ups, results).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

from redis.exceptions import RedisError

from ..backends import ServerBackend, backend_of
from ..backends.drivers import run
from ..backends.eviction import read_evictions
from ..backends.wire import execute, execute_many
from ..conf import lock_settings
from ..core import flows
from ..core.lease import job_id_checked
from ..primitives.keys import LockKeys, lock_keys, namespace, readable_tag
from ..primitives.lock import Lock
from ..signals import lock_force_released
from .records import LockInfo, lock_info, seconds_left, text

__all__ = [
    "LockInfo",
    "eviction_warnings",
    "force_release",
    "get_lock",
    "glob_escape",
    "incomplete",
    "iter_locks",
    "lease_commands",
    "leases_from",
    "page",
    "read_leases",
    "release_job",
    "scan_page",
    "waiting",
]

logger = logging.getLogger("django_redis_lock")

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
_MAX_SCAN_COUNT = 1000


def glob_escape(text: str) -> str:
    """``text`` matched literally by Redis' glob patterns (``* ? [ ] \\``)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def read_leases(client: Any, keys: list[str]) -> Iterator[LockInfo]:
    """The locks whose lease keys are ``keys`` (found by ``SCAN`` on ``client``, a plain
    client of the server that has them): records, TTLs and queue lengths, in one round trip.
    Those gone meanwhile are left out. The admin page and the CLI read with it; the census
    sends :func:`lease_commands` along with its next ``SCAN`` and reads with
    :func:`leases_from`."""
    if keys:
        yield from leases_from(keys, execute_many(client, lease_commands(keys)))


def lease_commands(keys: list[str]) -> list[tuple[str, str]]:
    """What :func:`leases_from` reads for lease keys ``keys``: three commands a key."""
    return [
        command
        for key in keys
        for command in (("GET", key), ("PTTL", key), ("LLEN", LockKeys.of(key).queue))
    ]


def leases_from(keys: list[str], replies: list[Any]) -> Iterator[LockInfo]:
    """The locks of lease keys ``keys``, from the replies to :func:`lease_commands`."""
    for index, key in enumerate(keys):
        value, pttl, queued = replies[3 * index : 3 * index + 3]
        if isinstance(pttl, Exception):
            raise pttl
        waiting = queued if isinstance(queued, int) else 0  # a queue key of another type
        if isinstance(value, Exception):
            # Not a string: someone else's key in our namespace. Show it, do not crash.
            yield LockInfo(
                key=key, name=key, token="", ttl=seconds_left(int(pttl)), waiting=waiting,
                valid=False,
            )  # fmt: skip
            continue
        if value is None or pttl == -2:  # expired between the SCAN and the read
            continue
        yield lock_info(key, value, int(pttl), waiting)


def _patterns(match: str | None, alias: str) -> list[tuple[str, bool]]:
    """The ``SCAN`` patterns, one after the other, each with whether it may list a name with a
    hash tag of its own (``{tag}{#hash}``, primitives/keys.py): each key is listed by one
    pattern only."""
    base = glob_escape(namespace(alias))
    if not match:
        return [(base + "{*}", True)]
    # Hashed names, and names with a tag of their own: matched against their records below.
    patterns = [(base + "{#*}", True), (base + "{[^#]*}{#*}", True)]
    if readable_tag(match):  # a readable name containing `match` has it in its key too
        patterns.insert(0, (base + "{*" + glob_escape(match) + "*}", False))
    return patterns


def _wanted(info: LockInfo, match: str | None) -> bool:
    return not match or match in info.name


def _lookup(backend: ServerBackend, key: str) -> LockInfo | None:
    """The record of ``key`` (in quorum mode, from the first server that has it)."""
    found: LockInfo | None = backend.read_first(
        key, lambda server: next(read_leases(server, [key]), None)
    )
    return found


def _not_on(servers: list[Any], keys: list[str]) -> list[str]:
    """``keys`` less those that one of ``servers`` has: a quorum's lock is listed once, by the
    first of its servers that has it."""
    for server in servers:
        if not keys:
            break
        try:
            present = execute_many(server, [("EXISTS", key) for key in keys])
        except RedisError:
            continue  # a server that is down listed nothing either
        keys = [key for key, there in zip(keys, present, strict=True) if there != 1]
    return keys


def page(
    cursor: str = "0", page_size: int = 100, *, match: str | None = None, using: str | None = None
) -> tuple[list[LockInfo], str | None]:
    """One page of live locks: ``(items, next_cursor)``; ``next_cursor`` is None at the end.

    Pages hold about ``page_size`` locks (``SCAN`` batches are not cut, so that no lock is
    skipped between pages). ``match`` keeps the locks whose name contains it. On Redis Cluster
    every primary is scanned in turn; for a quorum every server, each lock listed once.
    """
    items, next_cursor, _ = scan_page(cursor, page_size, match=match, using=using)
    return items, next_cursor


def scan_page(
    cursor: str = "0",
    page_size: int = 100,
    *,
    match: str | None = None,
    using: str | None = None,
    unreachable: list[str] | None = None,
) -> tuple[list[LockInfo], str | None, int]:
    """:func:`page`, plus how many keys of our namespace ``SCAN`` returned for it. For a
    quorum, the servers that could not be listed are added to ``unreachable`` (as
    ``"alias: error"``), if given."""
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise ValueError(f"page_size must be a positive int, not {page_size!r}.")
    alias = using or lock_settings.CACHE_ALIAS
    backend = backend_of(alias)
    targets = backend.servers()
    quorum = backend.majority is not None  # a lock is on several servers: list it once
    patterns = _patterns(match, alias)
    parts = cursor.split(":")
    try:
        if len(parts) == 1:
            target_index, phase_index, position = 0, 0, int(parts[0])
        elif len(parts) == 3:
            target_index, phase_index, position = map(int, parts)
        else:
            raise ValueError(cursor)
    except ValueError:
        raise ValueError(f"Not a cursor from a previous page: {cursor!r}.") from None
    items: list[LockInfo] = []
    seen: set[str] = set()
    scanned = 0
    count = page_size
    while target_index < len(targets) and len(items) < page_size:
        target_name, target = targets[target_index]
        try:
            pattern, tagged = patterns[phase_index]
            position, keys = execute(target, "SCAN", position, "MATCH", pattern, "COUNT", count)
        except RedisError as exc:
            if not quorum:
                raise
            # One server of a quorum down: list what the others hold.
            logger.info("Cannot list the locks on %r: %s", target_name, exc)
            if unreachable is not None:
                unreachable.append(f"{target_name}: {exc}")
            target_index, phase_index, position = target_index + 1, 0, 0
            continue
        if len(keys) < count // 4:
            # Locks are sparse among this Redis' keys: look at more keys per call, up to a
            # bound that keeps each SCAN short (the server is single-threaded).
            count = min(count * 2, _MAX_SCAN_COUNT)
        position = int(position)
        scanned += len(keys)
        fresh = [
            k
            for k in map(text, keys)
            if k.endswith("}") and k not in seen and (tagged or "}{" not in k)
        ]
        seen.update(fresh)
        if quorum:
            fresh = _not_on([server for _, server in targets[:target_index]], fresh)
        items.extend(info for info in read_leases(target, fresh) if _wanted(info, match))
        if position == 0:  # this pattern is done on this server: the next, or the next server
            phase_index += 1
            if phase_index == len(patterns):
                target_index, phase_index = target_index + 1, 0
    if target_index >= len(targets):
        return items, None, scanned
    return items, f"{target_index}:{phase_index}:{position}", scanned


def iter_locks(
    match: str | None = None,
    count: int = 500,
    *,
    using: str | None = None,
    unreachable: list[str] | None = None,
) -> Iterator[LockInfo]:
    """Every live lock (whose name contains ``match``), ``count`` keys per ``SCAN`` batch.
    For a quorum, the servers that could not be listed are added to ``unreachable`` (see
    :func:`incomplete`)."""
    cursor: str | None = "0"
    while cursor is not None:
        items, cursor, _ = scan_page(
            cursor, count, match=match, using=using, unreachable=unreachable
        )
        yield from items


def incomplete(unreachable: list[str], *, using: str | None = None) -> str | None:
    """Why a listing of a quorum's locks that could not read the ``unreachable`` servers may
    miss some (fewer than a majority were read), or None when it cannot: a quorum's lock is
    held on a majority, so with a majority read, one of them has it."""
    return backend_of(using or lock_settings.CACHE_ALIAS).incomplete(unreachable)


def get_lock(name: str, *, using: str | None = None) -> LockInfo | None:
    """The live lock ``name``, or None when nobody holds it."""
    alias = using or lock_settings.CACHE_ALIAS
    return _lookup(backend_of(alias), lock_keys(name, alias).lease)


def waiting(name: str, *, using: str | None = None) -> int:
    """How many are queued for the lock ``name`` now (0 in quorum mode: it has no queue)."""
    alias = using or lock_settings.CACHE_ALIAS
    backend = backend_of(alias)
    if not backend.queues:
        return 0
    queue = lock_keys(name, alias).queue
    return int(execute(backend.server_of(queue), "LLEN", queue))


def force_release(
    name: str, token: str, *, using: str | None = None, by: str | None = None
) -> bool:
    """Delete the lock ``name`` if it still carries ``token`` (the one that was shown).

    Returns False, deleting nothing, when the lock changed hands (or is gone) meanwhile. Hands
    the lock to the next waiter, if any. The former holder's renewal then reports the lock lost
    (``LockLost``).
    Raises ``ValueError``, deleting nothing, when the key of ``name`` is not a lock (some
    other key in our namespace), and ``RedisError`` when Redis cannot be reached.
    """
    alias = using or lock_settings.CACHE_ALIAS
    backend = backend_of(alias)
    keys = lock_keys(name, alias)
    info = _lookup(backend, keys.lease)
    released = run(flows.release(keys, token, ""), backend)
    if released == -2:
        raise ValueError(
            f"{name!r} is not a lock: its key {keys.lease} holds something else. Nothing was "
            "deleted."
        )
    if released < 0:
        return False
    lock_force_released.send(
        sender=Lock, name=name, token=token, owner=info.as_dict() if info else None, by=by
    )
    return True


def release_job(
    name: str, job_id: str, *, using: str | None = None, by: str | None = None
) -> bool:
    """Release the lock ``name`` if the job ``job_id`` holds it (``Lock(..., job_id=...)``):
    for a worker's supervisor after the job died (a hard time limit, a killed worker, a revoke),
    so that the next run need not wait for the lease to end. Nobody else's hold is touched.
    Returns False when the job does not hold it (any more). As :func:`force_release`
    otherwise: the next waiter gets it, ``lock_force_released`` is sent."""
    job_id = job_id_checked(job_id)
    info = get_lock(name, using=using)
    if info is None or info.job_id != job_id:
        return False
    return force_release(name, info.token, using=using, by=by or f"the end of job {job_id}")


def eviction_warnings(*, using: str | None = None) -> list[str]:
    """What could evict lock keys early: one line per server that has a ``maxmemory`` and a
    ``maxmemory-policy`` other than ``noeviction`` (an evicted lease lets a second holder in).

    A server that does not let us read its ``INFO memory`` (renamed or refused, as on some
    managed services and for an ACL user without the locks' rule) gets a line that says so,
    and what to make sure of; one that cannot be reached is passed over: this is advice, not a
    check (``backends/eviction.py``).
    """
    alias = using or lock_settings.CACHE_ALIAS
    return [eviction.advice for eviction in read_evictions(alias) if eviction.advice is not None]
