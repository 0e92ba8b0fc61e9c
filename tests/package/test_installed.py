"""``make test-wheel``: the package under test is the built wheel installed in a venv, not the
checkout (skipped in the ordinary run, where it is the checkout)."""

from __future__ import annotations

import importlib.resources
import os
import sysconfig
from pathlib import Path

import pytest

import django_redis_lock
from django_redis_lock.backends.base import SCRIPTS

pytestmark = pytest.mark.skipif(
    not os.environ.get("TEST_INSTALLED_WHEEL"), reason="make test-wheel runs it (the wheel's)"
)


def test_the_package_is_the_installed_wheels():
    installed = Path(sysconfig.get_paths()["purelib"]).resolve()
    package = Path(django_redis_lock.__file__).resolve().parent
    assert package.parent == installed, package
    assert not (Path.cwd() / "django_redis_lock").exists()  # (nothing to import beside us)


def test_the_wheel_carries_the_data_files():
    files = importlib.resources.files("django_redis_lock")
    assert files.joinpath("py.typed").is_file()
    lua = {p.name for p in Path(str(files / "backends" / "lua")).glob("*.lua")}
    assert len(lua) >= len(SCRIPTS) >= 5, lua  # (each script read from the wheel's lua/)
    templates = [p.name for p in Path(str(files / "templates")).rglob("*.html")]
    assert "duplicate_submission.html" in templates
    assert "change_list.html" in templates
    migrations = [p.name for p in Path(str(files / "migrations")).glob("0*.py")]
    assert len(migrations) >= 2
