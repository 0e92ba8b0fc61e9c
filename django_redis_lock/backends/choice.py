"""Choosing a backend: once per client, by its class (django-redis' ``CLIENT_CLASS`` idea),
and kept as long as the client is; per alias, until the settings change.

The backend is kept on the client itself (an attribute), not in a table of ours: a backend
holds its client, so a table keyed by the client, even weakly, would keep both for good (one
pair for every event loop's asyncio client, and for each quorum acquisition's).
"""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from ..conf import PREFIX
from .base import Backend
from .clients import LockAlias, async_lock_client, lock_client
from .cluster import AsyncClusterBackend, ClusterBackend
from .quorum import AsyncQuorumClient, QuorumClient
from .quorum.backend import AsyncQuorumBackend, QuorumBackend
from .server import AsyncServerBackend, ServerBackend

__all__ = ["async_backend_for", "async_backend_of", "backend_for", "backend_of"]

# The attribute of a client that holds its backend.
_BACKEND = "_django_redis_lock_backend"

# The first class a client is an instance of names its backend; any other: one server's.
_SYNC: tuple[tuple[type, type[ServerBackend]], ...] = (
    (QuorumClient, QuorumBackend),
    (RedisCluster, ClusterBackend),
)
_ASYNC: tuple[tuple[type, type[AsyncServerBackend]], ...] = (
    (AsyncQuorumClient, AsyncQuorumBackend),
    (AsyncRedisCluster, AsyncClusterBackend),
)


def _chosen(client: Any, kinds: tuple[tuple[type, type[Backend]], ...], default: type) -> Any:
    backend = client.__dict__.get(_BACKEND)
    if backend is None:
        chosen = next((backend for kind, backend in kinds if isinstance(client, kind)), default)
        backend = chosen(client)
        setattr(client, _BACKEND, backend)
    return backend


def backend_for(client: Any) -> ServerBackend:
    """The backend for a client of ``clients.lock_client()`` (or of one server)."""
    backend: ServerBackend = _chosen(client, _SYNC, ServerBackend)
    return backend


def async_backend_for(client: Any) -> AsyncServerBackend:
    """:func:`backend_for` for a client of ``clients.async_lock_client()``."""
    backend: AsyncServerBackend = _chosen(client, _ASYNC, AsyncServerBackend)
    return backend


_by_alias: dict[LockAlias, ServerBackend] = {}


def backend_of(alias: LockAlias) -> ServerBackend:
    """The backend of the locks of ``alias`` (``clients.lock_client``), kept until the
    settings change."""
    backend = _by_alias.get(alias)
    if backend is None:
        backend = _by_alias[alias] = backend_for(lock_client(alias))
    return backend


def async_backend_of(alias: LockAlias) -> AsyncServerBackend:
    """:func:`backend_of` for asyncio. Its client is one per event loop
    (``clients.async_lock_client``), so the backend is found by its client each time."""
    return async_backend_for(async_lock_client(alias))


@receiver(setting_changed)
def _forget_backends(*, setting: str, **kwargs: Any) -> None:
    if setting == "CACHES" or setting.startswith(PREFIX):
        _by_alias.clear()
