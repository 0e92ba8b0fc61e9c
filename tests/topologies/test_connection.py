import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from django_redis_lock import get_redis_client
from django_redis_lock.backends.clients import CacheBackend, UnsupportedCache, cache_backend
from tests.conftest import django_redis_caches
from tests.support import factories

DJANGO_BACKEND = "django.core.cache.backends.redis.RedisCache"


def assert_same_server(client, redis_client):
    """``client`` reads what ``redis_client`` (the test's own connection) wrote."""
    redis_client.set("marker", "here")
    assert client.get("marker") == b"here"


def test_django_redis_default_alias(redis_client):
    client = get_redis_client()
    assert isinstance(client, redis.Redis)
    assert_same_server(client, redis_client)
    assert cache_backend("default") is CacheBackend.DJANGO_REDIS


def test_djangos_own_redis_cache(settings, redis_url, redis_client):
    settings.CACHES = {"default": {"BACKEND": DJANGO_BACKEND, "LOCATION": redis_url}}
    client = get_redis_client()
    assert isinstance(client, redis.Redis)
    assert_same_server(client, redis_client)
    assert cache_backend("default") is CacheBackend.DJANGO


def test_client_is_reused_per_alias():
    assert get_redis_client() is get_redis_client()
    assert get_redis_client("default") is get_redis_client()


def test_changed_settings_give_a_fresh_client(settings, redis_url):
    first = get_redis_client()
    settings.CACHES = {"default": {"BACKEND": DJANGO_BACKEND, "LOCATION": redis_url}}
    assert get_redis_client() is not first


def test_named_alias_for_locks(settings, redis_url, redis_client):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "locks": django_redis_caches(redis_url)["default"],
    }
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "locks"
    assert_same_server(get_redis_client(), redis_client)
    with pytest.raises(UnsupportedCache):
        get_redis_client("default")


@pytest.fixture
def primary_and_replica(redis_server_factory):
    primary = redis_server_factory()
    replica = redis_server_factory(args=["--replicaof", primary.host, str(primary.port)])
    return primary, replica


@pytest.mark.parametrize("backend", ["django_redis.cache.RedisCache", DJANGO_BACKEND])
def test_locks_go_to_the_primary_never_a_replica(settings, primary_and_replica, backend):
    primary, replica = primary_and_replica
    settings.CACHES = {"default": {"BACKEND": backend, "LOCATION": [primary.url, replica.url]}}
    client = get_redis_client()
    assert client.info("replication")["role"] == "master"
    assert client.connection_pool.connection_kwargs["port"] == primary.port
    client.set("written", "1")  # a replica would answer READONLY


def test_connection_factory_is_called_with_the_alias_once(settings, redis_client):
    factories.calls.clear()
    settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = (
        "tests.support.factories.client_from_cache_location"
    )
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "cluster"  # need not be a cache with a factory
    client = get_redis_client()
    assert get_redis_client() is client
    assert factories.calls == ["cluster"]
    assert_same_server(client, redis_client)


def test_connection_factory_must_return_a_redis_client(settings):
    settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = "tests.support.factories.not_a_client"
    with pytest.raises(ImproperlyConfigured, match=r"returned 'object'.*redis\.Redis"):
        get_redis_client()


@pytest.mark.parametrize(
    ("caches", "message"),
    [
        (
            {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
            "not a Redis cache",
        ),
        (
            # Another library's option: it is not ours to import, whatever it names.
            {
                "default": {
                    "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                    "OPTIONS": {"CLIENT_CLASS": "not_installed.Client"},
                }
            },
            "not a Redis cache",
        ),
        (
            {"other": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
            "'default' is not in settings.CACHES",
        ),
        (
            django_redis_caches(
                ["redis://127.0.0.1:1/0", "redis://127.0.0.1:1/1"],
                CLIENT_CLASS="django_redis.client.ShardClient",
            ),
            "ShardClient",
        ),
    ],
)
def test_unsupported_cache_says_what_to_do(settings, caches, message):
    settings.CACHES = caches
    with pytest.raises(ImproperlyConfigured, match=message) as info:
        get_redis_client()
    assert "DJANGO_REDIS_LOCK_" in str(info.value)  # the way out is named


def test_bad_settings_surface_when_connecting(settings):
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = ""
    with pytest.raises(ImproperlyConfigured, match="DJANGO_REDIS_LOCK_CACHE_ALIAS"):
        get_redis_client()


@pytest.mark.parametrize(
    ("alias", "error"), [(5, TypeError), (b"default", TypeError), ("", ValueError)]
)
def test_bad_alias_argument(alias, error):
    with pytest.raises(error):
        get_redis_client(alias)


def test_nothing_is_contacted_until_used(settings):
    # Resolving the client must not need Redis: the unreachable placeholder resolves fine.
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")
    client = get_redis_client()
    with pytest.raises(redis.ConnectionError):
        client.ping()
