"""Choosing a backend: once per client, by its class (django-redis' ``CLIENT_CLASS`` idea),
and kept as long as the client is; per alias, until the settings change."""

from __future__ import annotations

import weakref
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

_backends: weakref.WeakKeyDictionary[Any, Backend] = weakref.WeakKeyDictionary()

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
    backend = _backends.get(client)
    if backend is None:
        chosen = next((backend for kind, backend in kinds if isinstance(client, kind)), default)
        backend = _backends[client] = chosen(client)
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
