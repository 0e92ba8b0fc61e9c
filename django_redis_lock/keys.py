"""Key layout: from a lock's readable name to the Redis keys that hold it.

    <ns>{<tag>}            the lease (a string: token|since|fence|owner record, lease.py)
    <ns>{<tag>}:q          the waiters, first come first served (a list of tokens)
    <ns>{<tag>}:d          each waiter's liveness deadline and owner record (a hash)
    <ns>{<tag>}:w:<token>  one waiter's wake-up list
    <ns>{<tag>}:r          the result of the guarded work, kept for duplicates (submissions)

Only the lease exists while a lock is held uncontended; the queue keys exist while someone waits,
and nothing is left once the lock is free.
    <ns>{!replay-budget}:<ms>  bytes of those results kept per client, per window (replays.py)

where ``<ns>`` is ``<cache KEY_PREFIX>:<DJANGO_REDIS_LOCK_KEY_PREFIX>:`` (no cache prefix: just
``<DJANGO_REDIS_LOCK_KEY_PREFIX>:``).

(``!`` is in no readable name and no hashed tag, so the budget's tag is never a lock's.)

All keys of one lock share the ``{<tag>}`` hash tag, so they live in one Redis Cluster slot and
one Lua script may touch them all. The tag is the name itself when the name is short and made
of plain characters (readable in ``redis-cli``); any other name (braces, spaces, unicode,
glob characters, 10 kB of text) is hashed, prefixed with ``#`` so it can never equal a readable
name; the owner record then keeps the readable name.

The cache ``VERSION`` is deliberately ignored: bumping it in a rolling deploy must not split old
and new processes into two lock namespaces.
"""

from __future__ import annotations

import hashlib
import re

from django.conf import settings

from .conf import lock_settings
from .connection import quorum_members
from .core.lease import LockKeys

__all__ = [
    "LockKeys",
    "lock_keys",
    "name_in_key",
    "namespace",
    "readable_tag",
    "replay_budget_key",
]

_READABLE = re.compile(r"[A-Za-z0-9._:/@+=-]{1,100}")


def readable_tag(name: str) -> bool:
    """Whether ``name`` is its own tag in the keys (else the tag is a hash of it)."""
    return bool(_READABLE.fullmatch(name))


def name_in_key(key: str) -> str | None:
    """The readable name a lease key shows (None: the key holds a hash of the name)."""
    tag = key[key.rfind("{") + 1 : -1] if key.endswith("}") else ""
    return tag if tag and not tag.startswith("#") else None


def _tag(name: str) -> str:
    if readable_tag(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return "#" + digest[:32]


def namespace(alias: str | tuple[str, ...]) -> str:
    """The prefix every lock key of ``alias`` starts with, ending in ``:``.

    A quorum's servers may belong to caches with different prefixes: its keys use none, so
    that every server holds the same keys.
    """
    if quorum_members(alias) is not None:
        cache_prefix = ""
    else:
        cache_prefix = getattr(settings, "CACHES", {}).get(alias, {}).get("KEY_PREFIX", "")
    ours = lock_settings.KEY_PREFIX
    return f"{cache_prefix}:{ours}:" if cache_prefix else f"{ours}:"


def lock_keys(name: str, alias: str | tuple[str, ...]) -> LockKeys:
    return LockKeys.of(f"{namespace(alias)}{{{_tag(name)}}}")


def replay_budget_key(alias: str | tuple[str, ...], window_ms: int) -> str:
    """The key counting the bytes of replayed results kept in windows of ``window_ms``."""
    return f"{namespace(alias)}{{!replay-budget}}:{window_ms}"
