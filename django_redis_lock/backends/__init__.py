"""Carrying the core's requests (``core/requests.py``) to Redis: one backend per topology,
chosen once per client (django-redis' ``CLIENT_CLASS`` idea), and the sync and async drivers
(``drivers.py``) that run a flow on one.

- :class:`ServerBackend`: one server, directly or through Sentinel (a ``redis.Redis``);
- :class:`ClusterBackend`: Redis Cluster (each command routed to its key's node, once);
- :class:`QuorumBackend`: several independent servers held as a majority (``quorum/``):
  no queue, so its waiters poll.

Each has an async twin over the ``redis.asyncio`` client of the same servers.
"""

from __future__ import annotations

from .server import (
    AsyncClusterBackend,
    AsyncQuorumBackend,
    AsyncServerBackend,
    Backend,
    ClusterBackend,
    QuorumBackend,
    ServerBackend,
    async_backend_for,
    backend_for,
    backend_of,
)

__all__ = [
    "AsyncClusterBackend",
    "AsyncQuorumBackend",
    "AsyncServerBackend",
    "Backend",
    "ClusterBackend",
    "QuorumBackend",
    "ServerBackend",
    "async_backend_for",
    "backend_for",
    "backend_of",
]
