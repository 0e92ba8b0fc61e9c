"""All of the Redis I/O, and every question of topology: one backend per topology, chosen
once per client by its class (``choice.py``, django-redis' ``CLIENT_CLASS`` idea), and the sync
and async drivers (``drivers.py``) that run the core's flows on one.

- ``base.py``: :class:`Backend`, what all share, and the one mapping of a request onto them;
- ``server.py``: :class:`ServerBackend`, one server, directly or through Sentinel;
- ``cluster.py``: :class:`ClusterBackend`, Redis Cluster (each command routed to its key's
  node, once; what must share a connection goes to the node's own client);
- ``quorum/``: :class:`QuorumBackend` and its client, several independent servers held as a
  majority: no queue, so its waiters poll;
- ``wire.py`` (a command sent once, on a pooled connection), ``waits.py`` (blocking on a
  wake-up list), ``scripts.py`` and ``lua/`` (the scripts), ``scanning.py``, ``renewal.py``
  (many leases renewed at once), ``clients.py`` (the client of a cache alias).

Each backend has an async twin over the ``redis.asyncio`` client of the same servers. Outside
this folder nothing asks which topology it runs on: it asks the backend (``backend_of(alias)``,
``async_backend_of(alias)``).
"""

from __future__ import annotations

from .base import Backend
from .choice import async_backend_for, async_backend_of, backend_for, backend_of
from .cluster import AsyncClusterBackend, ClusterBackend
from .quorum.backend import AsyncQuorumBackend, QuorumBackend
from .server import AsyncServerBackend, ServerBackend

__all__ = [
    "AsyncClusterBackend",
    "AsyncQuorumBackend",
    "AsyncServerBackend",
    "Backend",
    "ClusterBackend",
    "QuorumBackend",
    "ServerBackend",
    "async_backend_for",
    "async_backend_of",
    "backend_for",
    "backend_of",
]
