import math

import pytest
from django.core import checks

from django_redis_lock.checks import check_cache
from tests.conftest import django_redis_caches


def our_messages(tags=None):
    return [m for m in checks.run_checks(tags=tags) if m.id.startswith("django_redis_lock.")]


def our_ids(tags=None):
    return sorted(m.id for m in our_messages(tags))


def test_default_configuration_is_silent():
    assert our_messages() == []


def test_checks_are_registered_with_the_caches_tag_too(settings):
    # `manage.py check --tag caches` must include the cache check.
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "no-such-cache"
    assert our_ids(tags=["caches"]) == ["django_redis_lock.E001"]


# -- settings: E004 wrong type, E005 out of range, E006 factory not importable --------------


@pytest.mark.parametrize(
    ("name", "value", "check_id"),
    [
        ("TIMEOUT", "30", "E004"),
        ("TIMEOUT", True, "E004"),
        ("TIMEOUT", 0, "E005"),
        ("TIMEOUT", -5, "E005"),
        ("TIMEOUT", math.nan, "E005"),
        ("TIMEOUT", math.inf, "E005"),
        ("WAIT", "10", "E004"),
        ("WAIT", -1, "E005"),
        ("WAIT", math.nan, "E005"),
        ("WAIT", math.inf, "E005"),
        ("KEY_PREFIX", "", "E005"),
        ("KEY_PREFIX", "{lock}", "E005"),
        ("KEY_PREFIX", 7, "E004"),
        ("AUTO_RENEW", "false", "E004"),
        ("FAIL_OPEN", 0, "E004"),
        ("ENABLED", "True", "E004"),
        ("COMMAND_EXIT_CODE", 300, "E005"),
        ("COMMAND_EXIT_CODE", 1.0, "E004"),
        ("COMMAND_ON_LOST", "crash", "E005"),
        ("CONNECTION_FACTORY", 1.5, "E004"),
        ("CONNECTION_FACTORY", "no.such.factory", "E006"),
        ("CONNECTION_FACTORY", "tests.support.factories.NOT_CALLABLE", "E006"),
    ],
)
def test_bad_setting_fires(settings, name, value, check_id):
    setattr(settings, f"DJANGO_REDIS_LOCK_{name}", value)
    messages = our_messages()
    assert [m.id for m in messages] == [f"django_redis_lock.{check_id}"]
    assert f"DJANGO_REDIS_LOCK_{name}" in messages[0].msg
    assert messages[0].is_serious()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TIMEOUT", 30),
        ("TIMEOUT", 0.25),
        ("WAIT", 0),
        ("WAIT", 2.5),
        ("KEY_PREFIX", "locks:v2"),
        ("AUTO_RENEW", False),
        ("FAIL_OPEN", True),
        ("ENABLED", False),
        ("COMMAND_EXIT_CODE", 0),
        ("COMMAND_ON_LOST", "finish"),
        ("CONNECTION_FACTORY", None),
        ("CONNECTION_FACTORY", "tests.support.factories.client_from_cache_location"),
    ],
)
def test_good_setting_is_silent(settings, name, value):
    setattr(settings, f"DJANGO_REDIS_LOCK_{name}", value)
    assert our_messages() == []


def test_bad_cache_alias_type_is_reported_once(settings):
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = 5
    assert our_ids() == ["django_redis_lock.E004"]


# -- W001: unknown names ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("DJANGO_REDIS_LOCK_TIMOUT", "DJANGO_REDIS_LOCK_TIMEOUT"),
        ("DJANGO_REDIS_LOCK_DEFAULT_TIMEOUT", "DJANGO_REDIS_LOCK_TIMEOUT"),
        ("DJANGO_REDIS_LOCK_PREFIX", "DJANGO_REDIS_LOCK_KEY_PREFIX"),
        ("DJANGO_REDIS_LOCK_FAILOPEN", "DJANGO_REDIS_LOCK_FAIL_OPEN"),
        ("DJANGO_REDIS_LOCK_CACHE", "DJANGO_REDIS_LOCK_CACHE_ALIAS"),
    ],
)
def test_unknown_setting_warns_with_closest_name(settings, typo, suggestion):
    setattr(settings, typo, 1)
    messages = our_messages()
    assert [m.id for m in messages] == ["django_redis_lock.W001"]
    assert typo in messages[0].msg
    assert messages[0].hint == f"Did you mean {suggestion}?"
    assert not messages[0].is_serious()


def test_unknown_setting_without_close_match_lists_known_names(settings):
    settings.DJANGO_REDIS_LOCK_XYZZY = 1
    [message] = our_messages()
    assert message.id == "django_redis_lock.W001"
    assert "Did you mean" not in message.hint
    assert "DJANGO_REDIS_LOCK_TIMEOUT" in message.hint


def test_other_packages_settings_are_not_ours(settings):
    settings.DJANGO_REDIS_IGNORE_EXCEPTIONS = True
    settings.DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS = True
    settings.DJANGO_REDIS_CONNECTION_FACTORY = "django_redis.pool.ConnectionFactory"
    settings.DJANGO_REDIS_SCAN_ITERSIZE = 10
    settings.REDIS_LOCK_TIMEOUT = 5  # not close enough to ours to be a misspelling of it
    settings.LOCKDOWN_ENABLED = True
    assert our_messages() == []


@pytest.mark.parametrize(
    ("near_miss", "suggestion"),
    [
        ("DJANGO_REDIS_LOCKS_TIMEOUT", "DJANGO_REDIS_LOCK_TIMEOUT"),
        ("DJANGO_REDISLOCK_WAIT", "DJANGO_REDIS_LOCK_WAIT"),
        ("DJANGO_REDIS_LOCKS_FAILOPEN", "DJANGO_REDIS_LOCK_FAIL_OPEN"),
        ("DJANGO_REDIS_LOCKING_KEY_PREFIX", "DJANGO_REDIS_LOCK_KEY_PREFIX"),
    ],
)
def test_a_misspelt_prefix_warns_as_a_typo_does(settings, near_miss, suggestion):
    setattr(settings, near_miss, 1)
    [message] = our_messages()
    assert message.id == "django_redis_lock.W001"
    assert message.msg == f"{near_miss} is not a django-redis-lock setting and is ignored."
    assert message.hint == f"Did you mean {suggestion}?"


# -- cache: E001 missing alias, E002 not Redis, E003 ShardClient -----------------------------


def test_missing_alias_fires_e001(settings):
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "locks"
    [message] = our_messages()
    assert message.id == "django_redis_lock.E001"
    assert "'locks'" in message.msg
    assert "'default'" in message.msg


@pytest.mark.parametrize(
    "backend",
    [
        "django.core.cache.backends.locmem.LocMemCache",
        "django.core.cache.backends.dummy.DummyCache",
        "django.core.cache.backends.db.DatabaseCache",
    ],
)
def test_non_redis_cache_fires_e002(settings, backend):
    settings.CACHES = {"default": {"BACKEND": backend, "LOCATION": "x"}}
    [message] = our_messages(tags=["caches"])
    assert message.id == "django_redis_lock.E002"
    assert backend in message.msg


# Django's own cache checks crash on an unimportable class, so call ours directly here.


def test_unimportable_backend_fires_e002(settings):
    settings.CACHES = {"default": {"BACKEND": "no.such.Backend"}}
    [message] = check_cache()
    assert message.id == "django_redis_lock.E002"
    assert "'no.such.Backend'" in message.msg
    assert "cannot be imported" in message.msg


def test_unimportable_client_class_fires_e002(settings, redis_url):
    settings.CACHES = django_redis_caches(redis_url, CLIENT_CLASS="no.such.Client")
    [message] = check_cache()
    assert message.id == "django_redis_lock.E002"
    assert "CLIENT_CLASS" in message.msg


def test_backend_that_is_not_a_class_fires_e002(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.caches"}}
    [message] = check_cache()
    assert message.id == "django_redis_lock.E002"
    assert "not a class" in message.msg


def test_shard_client_fires_e003(settings, redis_url):
    settings.CACHES = django_redis_caches(
        [redis_url, redis_url.replace("/0", "/1")], CLIENT_CLASS="django_redis.client.ShardClient"
    )
    [message] = our_messages()
    assert message.id == "django_redis_lock.E003"
    assert "ShardClient" in message.msg
    assert "CONNECTION_FACTORY" in message.hint


@pytest.mark.parametrize(
    "client_class",
    [
        "django_redis.client.DefaultClient",
        "django_redis.client.HerdClient",
        "django_redis.client.SentinelClient",
    ],
)
def test_django_redis_clients_that_give_one_connection_are_silent(settings, client_class):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0", CLIENT_CLASS=client_class)
    assert our_messages() == []


def test_djangos_own_redis_cache_is_silent(settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    assert our_messages() == []


def test_second_alias_for_locks(settings):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "locks": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://x:1/0"},
    }
    assert our_ids() == ["django_redis_lock.E002"]
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "locks"
    assert our_messages() == []


def test_connection_factory_skips_cache_checks(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "cluster"
    settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = (
        "tests.support.factories.client_from_cache_location"
    )
    assert our_messages() == []


def test_check_command_exits_non_zero_on_errors(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.DJANGO_REDIS_LOCK_TIMEOUT = -1
    with pytest.raises(SystemCheckError, match=r"django_redis_lock\.E005"):
        call_command("check")


# -- deploy: W002 a lock cache without a socket timeout ---------------------------------------


def deploy_ids():
    return sorted(
        m.id
        for m in checks.run_checks(include_deployment_checks=True)
        if m.id.startswith("django_redis_lock.")
    )


def test_deploy_check_warns_of_a_lock_cache_without_socket_timeout(settings, redis_url):
    settings.CACHES = django_redis_caches(redis_url)
    assert deploy_ids() == ["django_redis_lock.W002"]
    assert our_ids() == []  # a deployment check only: runserver and tests stay quiet
    settings.CACHES = django_redis_caches(redis_url, SOCKET_TIMEOUT=2)
    assert deploy_ids() == []


def test_deploy_check_reads_djangos_own_redis_cache_option(settings, redis_url):
    cache = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url}
    settings.CACHES = {"default": cache}
    assert deploy_ids() == ["django_redis_lock.W002"]
    settings.CACHES = {"default": {**cache, "OPTIONS": {"socket_timeout": 1}}}
    assert deploy_ids() == []
