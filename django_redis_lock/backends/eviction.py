"""Whether a Redis may evict the locks' keys: its ``maxmemory`` and ``maxmemory-policy``.

A server with a memory limit and any policy but ``noeviction`` (``allkeys-lru``, common on a
cache's Redis; a ``volatile-*`` one too, since every key of ours has an expiry) may drop a held
lease under memory pressure, and a second ``acquire()`` then succeeds while the first holder
works; the holder learns it at its next renewal. The admin's Locks page, ``manage.py
redis_locks list``, ``manage.py check --deploy`` (W003) and each process's first lock
(``primitives/eviction.py``) say so, all from :func:`read_evictions`.

It reads ``INFO memory`` (both values, one command), not ``CONFIG GET``: managed services
that refuse ``CONFIG`` answer ``INFO``, and the locks' ACL rule grants ``INFO memory`` alone
(``acl.py``). One command to every server of an alias at once: one round trip, whatever the
topology (one server or Sentinel's primary, each Cluster primary, each member of a quorum).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from .acl import refusal_text
from .choice import backend_of
from .clients import LockAlias
from .wire import borrowed, no_reply, pack

__all__ = ["Eviction", "read_evictions"]

INFO_MEMORY = ("INFO", "memory")
# How long the servers have to answer, all together: advice is not worth a long wait (the
# first lock of a process waits for it; asyncio.run() waits for its worker thread). A server
# silent that long is left out, as an unreachable one is.
REPLY_TIMEOUT = 2.0


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
    replies = _each_reply([server.client for server in servers], INFO_MEMORY, REPLY_TIMEOUT)
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


def _each_reply(clients: Sequence[Any], args: Sequence[Any], reply_timeout: float) -> list[Any]:
    """One command to each of several servers (a plain client of each) in one round trip, not
    one per server: sent to them all, then each reply read, once, within ``reply_timeout`` in
    all. A server's error (refused, unreachable, silent) is returned in its place, not raised."""
    packed = [pack(args)]
    deadline = time.monotonic() + reply_timeout
    with contextlib.ExitStack() as stack:
        sent: list[Any] = []
        for client in clients:
            try:
                connection = stack.enter_context(borrowed(client))
                connection.send_packed_command(packed)
            except RedisError as error:  # redis-py dropped the connection it could not use
                sent.append(error)
            else:
                sent.append(connection)
        replies: list[Any] = []
        for connection in sent:
            if isinstance(connection, RedisError):
                replies.append(connection)
                continue
            try:
                if not connection.can_read(timeout=max(deadline - time.monotonic(), 0.0)):
                    connection.disconnect()  # its reply may still come: not to be reused
                    replies.append(no_reply(reply_timeout))
                    continue
                replies.append(connection.read_response())
            except RedisError as error:  # an error reply, or a connection redis-py dropped
                replies.append(error)
        return replies
