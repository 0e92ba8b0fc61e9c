"""System checks: report bad django-redis-lock settings at start-up, not at the first lock.

=========================  =================================================================
id                         problem
=========================  =================================================================
django_redis_lock.E001     ``CACHE_ALIAS`` names a cache that is not in ``settings.CACHES``
django_redis_lock.E002     that cache is not a Redis cache (or its classes cannot be imported)
django_redis_lock.E003     that cache uses django-redis' ``ShardClient`` (no single connection)
django_redis_lock.E004     a setting has the wrong type
django_redis_lock.E005     a setting has a value out of range (zero or negative lease, NaN, ...)
django_redis_lock.E006     ``CONNECTION_FACTORY`` cannot be imported or is not callable
django_redis_lock.E007     a ``QUORUMS`` name is also a cache alias (which one would it mean?)
django_redis_lock.E008     a ``METRICS`` exporter whose package is not installed
django_redis_lock.W001     an unknown ``DJANGO_REDIS_LOCK_*`` setting (a typo?), or one of ours
                           under a misspelt prefix (``DJANGO_REDIS_LOCKS_TIMEOUT``)
django_redis_lock.W002     (``--deploy``) a lock cache without a socket timeout
django_redis_lock.W003     (``--deploy``, asks Redis) a lock server that may evict lock keys
                           (``maxmemory`` with a policy but ``noeviction``), or whose policy
                           could not be read
=========================  =================================================================

The words come from the same validation that runs when a setting is read (``conf.py``) and
when a connection is made (``backends/clients.py``), so the check and the runtime error agree.
Only W003 contacts Redis, and only with ``--deploy``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.core.checks import Warning as CheckWarning
from django.core.exceptions import ImproperlyConfigured

from .backends.clients import CacheBackend, UnsupportedCache, cache_backend
from .backends.eviction import read_evictions
from .conf import PREFIX, SETTINGS, InvalidSetting, lock_settings
from .links import docs_page

__all__ = ["check_cache", "check_eviction", "check_settings", "check_socket_timeout"]


def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Each known setting has a usable value; unknown ``DJANGO_REDIS_LOCK_*`` names warn."""
    messages: list[CheckMessage] = []
    for name in SETTINGS:
        try:
            lock_settings.get(name)
        except InvalidSetting as exc:
            messages.append(Error(exc.message, hint=exc.hint or None, id=exc.check_id))
    names = dir(settings)
    messages.extend(_unknown_settings(name for name in names if name.startswith(PREFIX)))
    messages.extend(_near_misses(name for name in names if not name.startswith(PREFIX)))
    return messages


# How alike a name's start must be to our prefix to be taken for a misspelling of it
# (DJANGO_REDIS_LOCKS_, DJANGO_REDISLOCK_: 0.97; django-redis' own DJANGO_REDIS_: 0.83).
_NEAR_PREFIX = 0.85


def _near_misses(names: Iterable[str]) -> list[CheckMessage]:
    """Settings that are ours under a misspelt prefix (``DJANGO_REDIS_LOCKS_TIMEOUT``): a
    prefix that keeps the word LOCK and is otherwise close to ours, before one of our names."""
    ours = PREFIX.rstrip("_")
    warnings: list[CheckMessage] = []
    for name in sorted(names):
        parts = name.split("_")
        splits = [("_".join(parts[:i]), "_".join(parts[i:])) for i in range(1, len(parts))]
        likeness, tail = max(
            ((difflib.SequenceMatcher(None, head, ours).ratio(), tail) for head, tail in splits
             if "LOCK" in head),
            default=(0.0, ""),
        )  # fmt: skip
        close = _closest(tail) if likeness >= _NEAR_PREFIX else []
        if close:
            warnings.append(
                CheckWarning(
                    f"{name} is not a django-redis-lock setting and is ignored.",
                    hint=f"Did you mean {PREFIX}{close[0]}?",
                    id="django_redis_lock.W001",
                )
            )
    return warnings


def _closest(typo: str) -> list[str]:
    """The valid setting ``typo`` most likely meant (compared without the shared prefix,
    which would make every name look close)."""
    # A name inside the other beats spelling: DEFAULT_TIMEOUT meant TIMEOUT (extra words),
    # PREFIX meant KEY_PREFIX (missing words).
    inside = [name for name in SETTINGS if name in typo]
    if inside:
        return [max(inside, key=len)]
    around = [name for name in SETTINGS if typo in name]
    if around:
        return [min(around, key=len)]
    return difflib.get_close_matches(typo, list(SETTINGS), n=1, cutoff=0.6)


def _unknown_settings(names: Iterable[str]) -> list[CheckMessage]:
    known = [setting.full_name for setting in SETTINGS.values()]
    warnings: list[CheckMessage] = []
    for name in sorted(set(names) - set(known)):
        close = _closest(name.removeprefix(PREFIX))
        hint = (
            f"Did you mean {PREFIX}{close[0]}?"
            if close
            else f"Known settings: {', '.join(known)}."
        )
        warnings.append(
            CheckWarning(
                f"{name} is not a django-redis-lock setting and is ignored.",
                hint=hint,
                id="django_redis_lock.W001",
            )
        )
    return warnings


def check_cache(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """The cache alias (or each cache alias of every quorum) gives one Redis connection;
    quorum names do not shadow cache aliases. A factory makes the first check moot."""
    try:
        alias = lock_settings.CACHE_ALIAS
        quorums = lock_settings.QUORUMS
        factory = lock_settings.CONNECTION_FACTORY
    except InvalidSetting:
        return []  # check_settings reports it; one problem, one message.
    messages: list[CheckMessage] = []
    caches_setting = getattr(settings, "CACHES", {})
    for name in sorted(set(quorums) & set(caches_setting)):
        messages.append(
            Error(
                f"{PREFIX}QUORUMS names a quorum {name!r}, which is also a cache alias in "
                "settings.CACHES.",
                hint="Give the quorum a name of its own.",
                id="django_redis_lock.E007",
            )
        )
    if factory is not None:
        return messages
    if alias not in quorums:
        try:
            cache_backend(alias)
        except UnsupportedCache as exc:
            messages.append(Error(exc.message, hint=exc.hint, id=exc.check_id))
    for name, members in quorums.items():
        for member in members:
            try:
                cache_backend(member)
            except UnsupportedCache as exc:
                messages.append(
                    Error(
                        f"{PREFIX}QUORUMS[{name!r}]: {exc.message}",
                        hint="Each member of a quorum must be a Redis cache alias in "
                        "settings.CACHES, on a server of its own.",
                        id=exc.check_id,
                    )
                )
    return messages


def check_socket_timeout(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``manage.py check --deploy``: every cache the locks use sets a socket timeout. Without
    one, a Redis that stops answering holds up a release, an extension or a renewal for
    redis-py's default (5 s from redis-py 8.1, for ever before); acquisitions are bounded by
    their wait either way."""
    try:
        alias = lock_settings.CACHE_ALIAS
        quorums = lock_settings.QUORUMS
        factory = lock_settings.CONNECTION_FACTORY
    except InvalidSetting:
        return []  # check_settings reports it
    if factory is not None:
        return []  # the factory builds the client: its timeouts are not in settings
    caches_setting = getattr(settings, "CACHES", {})
    messages: list[CheckMessage] = []
    for member in quorums.get(alias, (alias,)):
        try:
            backend = cache_backend(member)
        except UnsupportedCache:
            continue  # check_cache reports it
        option = "socket_timeout" if backend is CacheBackend.DJANGO else "SOCKET_TIMEOUT"
        if caches_setting[member].get("OPTIONS", {}).get(option) is None:
            messages.append(
                CheckWarning(
                    f"The cache {member!r}, which the locks use, sets no {option}: a Redis "
                    "that stops answering holds up a lock's release, extension or renewal "
                    "for redis-py's default (5 s from redis-py 8.1, for ever before).",
                    hint=f"Set CACHES[{member!r}]['OPTIONS'][{option!r}], e.g. to 1 or 2 "
                    f"(seconds). See {docs_page('deployment.md')}",
                    id="django_redis_lock.W002",
                )
            )
    return messages


def check_eviction(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``manage.py check --deploy``: no server the locks use may evict their keys. The one
    check that contacts Redis (``INFO memory`` on each server, in one round trip): a cache
    Redis with ``maxmemory`` and ``allkeys-lru`` drops a held lease under memory pressure, and
    nothing in the settings shows it. Quiet when Redis cannot be reached or the settings are
    wrong (the other checks say so)."""
    try:
        evictions = read_evictions(lock_settings.CACHE_ALIAS)
    except ImproperlyConfigured:
        return []  # check_settings or check_cache reports it
    return [
        CheckWarning(
            f"{eviction.advice} (This deploy check asked the server: it contacts Redis, and "
            "says nothing of a server it cannot reach.)",
            hint="Set maxmemory-policy noeviction on the locks' Redis, or give the locks a "
            f"Redis of their own (DJANGO_REDIS_LOCK_CACHE_ALIAS). See {docs_page('servers.md')}",
            id="django_redis_lock.W003",
        )
        for eviction in evictions
        if eviction.advice is not None
    ]
