"""Kept import path: the Redis clients of a cache alias now live in ``backends/clients.py``;
import them from ``django_redis_lock``."""

from .backends.clients import (
    UnsupportedCache,
    aclose_async_redis_clients,
    get_async_redis_client,
    get_redis_client,
)

__all__ = [
    "UnsupportedCache",
    "aclose_async_redis_clients",
    "get_async_redis_client",
    "get_redis_client",
]
