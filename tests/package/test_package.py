import importlib.resources
import re
from pathlib import Path

from django.apps import apps

import django_redis_lock


def test_version_is_pep440():
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", django_redis_lock.__version__)


def test_public_api_is_reexported():
    for name in django_redis_lock.__all__:
        assert hasattr(django_redis_lock, name), name


def test_ships_py_typed():
    assert importlib.resources.files("django_redis_lock").joinpath("py.typed").is_file()


def test_app_config():
    config = apps.get_app_config("django_redis_lock")
    assert config.name == "django_redis_lock"
    assert str(config.verbose_name) == "Redis locks"


def test_only_conf_reads_our_settings():
    package = Path(django_redis_lock.__file__).parent
    reads_our_setting = re.compile(
        r"settings\.DJANGO_REDIS_LOCK_|getattr\(\s*settings,\s*f?[\"']DJANGO_"
    )
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "conf.py" and reads_our_setting.search(path.read_text())
    ]
    assert offenders == []
