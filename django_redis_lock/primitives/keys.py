"""Key layout: from a lock's readable name to the Redis keys that hold it.

    <ns>{<tag>}            the lease (a string: token|since|fence|owner record, lease.py)
    <ns>{<tag>}:q          the waiters, first come first served (a list of tokens)
    <ns>{<tag>}:d          each waiter's liveness deadline and owner record (a hash)
    <ns>{<tag>}:w:<token>  one waiter's wake-up list (for 5 s after an interrupted waiter left
                           the line: its mark, ``LEFT`` in backends/scripts.py)
    <ns>{<tag>}:r          the result of the guarded work, kept for duplicates (submissions)
    <ns>{<tag>}:r:<job>~   a finished job's id, kept for its copies (task guards; one per job)

A semaphore's keys are the same tag's, after ``:s`` (``core/permits.py``).

Only the lease exists while a lock is held uncontended; the queue keys exist while someone waits,
and nothing is left once the lock is free (but the mark of a waiter that was interrupted, 5 s).
    <ns>{!replay-budget}:<ms>  bytes of those results kept per client, per window (replays.py)
    <ns>{!process}:<id>        a process's record: where it runs, for dead holders

where ``<ns>`` is ``<cache KEY_PREFIX>:<DJANGO_REDIS_LOCK_KEY_PREFIX>:`` (no cache prefix: just
``<DJANGO_REDIS_LOCK_KEY_PREFIX>:``).

(``!`` is in no readable name and no hashed tag, so these tags are never a lock's; and they do not
end with ``}``, so the census never takes them for leases.)

All keys of one lock share the ``{<tag>}`` hash tag, so they live in one Redis Cluster slot and
one Lua script may touch them all. The tag is the name itself when the name is short and made
of plain characters (readable in ``redis-cli``); any other name (spaces, unicode, glob
characters, 10 kB of text) is hashed, prefixed with ``#`` so it can never equal a readable
name; the owner record then keeps the readable name.

A name may choose its slot as Redis Cluster's own keys do, with a hash tag of its own:
``account:{bank-1}:42``. Its keys start ``<ns>{bank-1}{#<hash of the name>}``: Redis hashes
the first braces, so every name tagged ``{bank-1}`` is in one slot and ``lock_many`` takes them
in one script; the second braces keep each name's keys its own. (The rule is Redis': the text
between the first ``{`` and the first ``}`` after it, when not empty.)

The cache ``VERSION`` is deliberately ignored: bumping it in a rolling deploy must not split old
and new processes into two lock namespaces.
"""

from __future__ import annotations

import hashlib
import re

from django.conf import settings

from ..backends.clients import quorum_members
from ..conf import lock_settings
from ..core.lease import LockKeys
from ..core.permits import PermitKeys

__all__ = [
    "LockKeys",
    "hash_tag",
    "lock_keys",
    "name_in_key",
    "namespace",
    "permit_keys",
    "process_key",
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


def hash_tag(name: str) -> str | None:
    """The hash tag ``name`` gives itself (``"bank-1"`` for ``account:{bank-1}:42``), or None:
    the text between its first ``{`` and the first ``}`` after it, when not empty."""
    start = name.find("{")
    end = name.find("}", start + 1) if start >= 0 else -1
    return name[start + 1 : end] if end > start + 1 else None


def _base(name: str, alias: str | tuple[str, ...]) -> str:
    """The key a primitive named ``name`` lives in; its other keys start with it."""
    tag = hash_tag(name)
    if tag is None:
        return f"{namespace(alias)}{{{_tag(name)}}}"
    # The name's own tag first (Redis hashes the first braces), then the name's hash.
    return f"{namespace(alias)}{{{_tag(tag)}}}{{{_tag(name)}}}"


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
    return LockKeys.of(_base(name, alias))


def permit_keys(name: str, alias: str | tuple[str, ...]) -> PermitKeys:
    """The keys of semaphore ``name`` (``core/permits.py``): beside a lock of the same name's,
    never the same."""
    return PermitKeys.of(_base(name, alias))


def process_key(alias: str | tuple[str, ...], process_id: str) -> str:
    """The record of the process ``process_id`` (``core/dead_holders.py``)."""
    return f"{namespace(alias)}{{!process}}:{process_id}"


def replay_budget_key(alias: str | tuple[str, ...], window_ms: int) -> str:
    """The key counting the bytes of replayed results kept in windows of ``window_ms``."""
    return f"{namespace(alias)}{{!replay-budget}}:{window_ms}"
