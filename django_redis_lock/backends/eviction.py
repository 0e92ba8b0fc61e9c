"""Whether a Redis may evict the locks' keys: its ``maxmemory`` and ``maxmemory-policy``.

A server with a memory limit and any policy but ``noeviction`` (``allkeys-lru``, common on a
cache's Redis; a ``volatile-*`` one too, since every key of ours has an expiry) may drop a held
lease under memory pressure, and a second ``acquire()`` then succeeds while the first holder
works; the holder learns it at its next renewal. The admin's Locks page, ``manage.py
redis_locks list``, ``manage.py check --deploy`` (W003) and each process's first lock
(``primitives/eviction_advice.py``) say so, all from :func:`read_evictions`.

It reads ``INFO memory`` (both values, one command), not ``CONFIG GET``: managed services
that refuse ``CONFIG`` answer ``INFO``, and the locks' ACL rule grants ``INFO memory`` alone
(``acl.py``). One command to every server of an alias at once: one round trip, whatever the
topology (one server or Sentinel's primary, each Cluster primary, each member of a quorum).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from .acl import refusal_text
from .choice import backend_of
from .clients import LockAlias
from .wire import execute_on_each

__all__ = ["Eviction", "read_evictions"]

INFO_MEMORY = ("INFO", "memory")


@dataclass(frozen=True)
class Eviction:
    """What one server said of its eviction, and what to tell people of it."""

    server: str  # for people: host:port, a Cluster node's name, a quorum member's alias
    maxmemory: int | None  # bytes; 0: no limit (None: not read)
    maxmemory_human: str
    policy: str | None  # None: not read
    unread: str | None = None  # why it could not be read (a refusal)

    @property
    def evicts(self) -> bool:
        """Whether this server may evict keys of ours under memory pressure."""
        return bool(self.maxmemory) and self.policy not in (None, "noeviction")

    @property
    def advice(self) -> str | None:
        """The line for people: the server may evict, or its policy could not be read and
        should be checked by hand; None when it keeps our keys."""
        if self.unread is not None:
            return (
                f"Could not read the eviction policy of Redis at {self.server} (INFO memory: "
                f"{self.unread}). Make sure its maxmemory-policy is noeviction (a managed "
                "service's console shows it): an evicted lease lets a second holder in."
            )
        if self.evicts:
            return (
                f"Redis at {self.server} may evict lock keys under memory pressure (maxmemory "
                f"{self.maxmemory_human}, maxmemory-policy {self.policy}): an evicted lease "
                "lets a second holder in. Give locks a Redis with maxmemory-policy noeviction."
            )
        return None


def read_evictions(alias: LockAlias) -> list[Eviction]:
    """What each server of ``alias`` says of its eviction, in one round trip. A server that
    cannot be reached is left out (this is advice, not a probe of health), as is a Cluster
    whose nodes cannot be listed. Raises ``ImproperlyConfigured`` for an alias the settings
    do not describe, as the locks would."""
    try:
        servers = backend_of(alias).servers()  # a Cluster client reads its slot map when built
    except (RedisError, RedisClusterException):
        return []
    replies = execute_on_each([server.client for server in servers], INFO_MEMORY)
    return [
        _eviction(server.name, reply)
        for server, reply in zip(servers, replies, strict=True)
        if not isinstance(reply, RedisError) or isinstance(reply, ResponseError)
    ]


def _eviction(server: str, reply: Any) -> Eviction:
    if isinstance(reply, ResponseError):  # INFO refused: renamed away, or not in the ACL
        return Eviction(server, None, "", None, unread=refusal_text(reply))
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    fields = {}  # "maxmemory:0", "maxmemory_policy:noeviction", ...
    for line in text.splitlines():
        name, colon, value = line.strip().partition(":")
        if colon:
            fields[name] = value
    policy = fields.get("maxmemory_policy")
    try:
        maxmemory = int(fields["maxmemory"])
    except (KeyError, ValueError):
        maxmemory = None
    if policy is None or maxmemory is None:
        return Eviction(server, None, "", None, unread="its reply has no maxmemory_policy")
    human = fields.get("maxmemory_human") or str(maxmemory)
    return Eviction(server, maxmemory, human, policy)
