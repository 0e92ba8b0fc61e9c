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


cluster_url: list[str] = []


cluster_connection_class: list[type] = []


def cluster_client(alias: str):
    """A RedisCluster client for the test cluster (tests set ``cluster_url``, and may set
    ``cluster_connection_class``)."""
    from redis.cluster import RedisCluster

    options = {"connection_class": cluster_connection_class[0]} if cluster_connection_class else {}
    return RedisCluster.from_url(cluster_url[0], **options)


valkey_location: list[str] = []


def valkey_client(alias: str):
    """A valkey-py client (tests set ``valkey_location``): the locks talk through its twin."""
    import valkey

    return valkey.Valkey.from_url(valkey_location[0])
