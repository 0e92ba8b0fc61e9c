"""Connection factories used by the tests of DJANGO_REDIS_LOCK_CONNECTION_FACTORY."""

import redis
from django.conf import settings

NOT_CALLABLE = "a string is not a factory"

calls: list[str] = []


def client_from_cache_location(alias: str) -> redis.Redis:
    """Build a client for the cache's LOCATION, recording each call."""
    calls.append(alias)
    return redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])


def not_a_client(alias: str) -> object:
    return object()
