"""Carrying the core's requests (``core/requests.py``) to Redis: one backend per topology,
chosen once per client by its class (``choice.py``, django-redis' ``CLIENT_CLASS`` idea), and
the sync and async drivers (``drivers.py``) that run a flow on one.

- ``server.py``: :class:`ServerBackend`, one server, directly or through Sentinel (a
  ``redis.Redis``), and :class:`Backend`, what all share;
- ``cluster.py``: :class:`ClusterBackend`, Redis Cluster (each command routed to its key's
  node, once; what must share a connection goes to the node's own client);
- ``quorum.py``: :class:`QuorumBackend`, several independent servers held as a majority
  (``quorum/``): no queue, so its waiters poll.

Each has an async twin over the ``redis.asyncio`` client of the same servers. The helpers in
``commands.py``, ``waits.py`` and ``scripts.py`` each serve one topology; the backend picks.
"""

from __future__ import annotations

from .choice import async_backend_for, backend_for, backend_of
from .cluster import AsyncClusterBackend, ClusterBackend
from .quorum.backend import AsyncQuorumBackend, QuorumBackend
from .server import AsyncServerBackend, Backend, ServerBackend

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
