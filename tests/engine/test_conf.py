import math

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_redis_lock.conf import PREFIX, SETTINGS, InvalidSetting, lock_settings


def test_defaults():
    assert lock_settings.CACHE_ALIAS == "default"
    assert lock_settings.KEY_PREFIX == "lock"
    assert lock_settings.TIMEOUT == 30
    assert lock_settings.WAIT == 10
    assert lock_settings.AUTO_RENEW is True
    assert lock_settings.FAIL_OPEN is False
    assert lock_settings.ENABLED is True
    assert lock_settings.CONNECTION_FACTORY is None
    assert lock_settings.COMMAND_EXIT_CODE == 75
    assert lock_settings.COMMAND_ON_LOST == "abort"


def test_every_setting_has_a_typed_property_and_valid_default():
    for name, setting in SETTINGS.items():
        assert setting.full_name == PREFIX + name
        assert getattr(lock_settings, name) == setting.validate(setting.full_name, setting.default)


def test_override_settings_is_seen_without_plumbing(settings):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 2.5
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "locks"
    assert lock_settings.TIMEOUT == 2.5
    assert lock_settings.CACHE_ALIAS == "locks"


def test_integer_seconds_are_given_as_float(settings):
    settings.DJANGO_REDIS_LOCK_WAIT = 3
    assert lock_settings.WAIT == 3.0
    assert isinstance(lock_settings.WAIT, float)


def test_wait_zero_is_allowed(settings):
    settings.DJANGO_REDIS_LOCK_WAIT = 0
    assert lock_settings.WAIT == 0


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("TIMEOUT", 0, "value"),
        ("TIMEOUT", -1, "value"),
        ("TIMEOUT", math.nan, "value"),
        ("TIMEOUT", math.inf, "value"),
        ("TIMEOUT", "30", "type"),
        ("TIMEOUT", True, "type"),
        ("TIMEOUT", None, "type"),
        ("WAIT", -0.5, "value"),
        ("WAIT", math.inf, "value"),
        ("WAIT", [], "type"),
        ("CACHE_ALIAS", "", "value"),
        ("CACHE_ALIAS", 3, "type"),
        ("KEY_PREFIX", "a{b", "value"),
        ("KEY_PREFIX", "a b", "value"),
        ("KEY_PREFIX", b"lock", "type"),
        ("AUTO_RENEW", "yes", "type"),
        ("FAIL_OPEN", 1, "type"),
        ("ENABLED", None, "type"),
        ("COMMAND_EXIT_CODE", 256, "value"),
        ("COMMAND_EXIT_CODE", -1, "value"),
        ("COMMAND_EXIT_CODE", "75", "type"),
        ("COMMAND_EXIT_CODE", True, "type"),
        ("COMMAND_ON_LOST", "ignore", "value"),
        ("COMMAND_ON_LOST", None, "type"),
        ("CONNECTION_FACTORY", 42, "type"),
        ("CONNECTION_FACTORY", "no_such_module.factory", "import"),
        ("CONNECTION_FACTORY", "tests.support.factories.NOT_CALLABLE", "import"),
    ],
)
def test_bad_value_raises_improperly_configured_on_read(settings, name, value, problem):
    setattr(settings, PREFIX + name, value)
    with pytest.raises(ImproperlyConfigured, match=PREFIX + name) as info:
        getattr(lock_settings, name)
    assert isinstance(info.value, InvalidSetting)
    assert info.value.problem == problem


def test_connection_factory_from_dotted_path(settings):
    from tests.support.factories import client_from_cache_location

    settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = (
        "tests.support.factories.client_from_cache_location"
    )
    assert lock_settings.CONNECTION_FACTORY is client_from_cache_location


def test_connection_factory_given_as_callable(settings):
    def factory(alias):
        raise AssertionError("not called by merely reading the setting")

    settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = factory
    assert lock_settings.CONNECTION_FACTORY is factory
