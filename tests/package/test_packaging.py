"""The built sdist and wheel carry everything, and the wheel installs into a clean venv."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEEDED = [
    "django_redis_lock/py.typed",
    "django_redis_lock/migrations/0001_initial.py",
    "django_redis_lock/templates/django_redis_lock/duplicate_submission.html",
    "django_redis_lock/templates/admin/django_redis_lock/heldlock/change_list.html",
    "django_redis_lock/templates/admin/django_redis_lock/heldlock/detail.html",
    "django_redis_lock/templates/admin/django_redis_lock/heldlock/release_confirmation.html",
    "django_redis_lock/management/commands/redis_locks.py",
    "django_redis_lock/management/commands/run_locked.py",
]


@pytest.fixture(scope="module")
def dist(testrun_uid):
    """The sdist and wheel of this tree, built once per run (the workers share it)."""
    # One build at a time in this tree: setuptools writes build/ and the egg-info in it, and
    # two workers building at once broke each other's. The first builds, the others find it.
    out = ROOT / "build" / "test-dist" / testrun_uid
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / ".dist-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not list(out.glob("*.whl")):
            shutil.rmtree(out.parent, ignore_errors=True)  # (earlier runs')
            subprocess.run(
                [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out),
                 str(ROOT)],
                check=True, capture_output=True, timeout=600,
            )  # fmt: skip
    return out


@pytest.fixture
def wheel_python(dist, tmp_path_factory):
    """A venv with only the built wheel (and what it brings: Django, django-redis, redis-py)."""
    [wheel] = dist.glob("*.whl")
    environment = tmp_path_factory.mktemp("wheel") / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return str(python)


def test_wheel_and_sdist_carry_templates_migrations_and_py_typed(dist):
    [wheel] = dist.glob("*.whl")
    [sdist] = dist.glob("*.tar.gz")
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert [path for path in NEEDED if path not in in_wheel] == []
    assert not any(name.startswith(("tests/", "dev/", "example_project/")) for name in in_wheel)
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert [path for path in NEEDED if path not in in_sdist] == []


def test_twine_check_passes(dist):
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# A project made as docs/quickstart.md says, in a venv with only the wheel (and what it brings:
# Django, django-redis, redis-py): its settings, then migrate, check --deploy, a guarded view,
# the admin's Locks page and the CLI.
QUICKSTART_SETTINGS = """
INSTALLED_APPS += ["django_redis_lock"]
CACHES = {{
    "default": {{
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": {redis_url!r},
        "OPTIONS": {{"SOCKET_TIMEOUT": 2}},
    }}
}}
ALLOWED_HOSTS = ["testserver"]
"""
QUICKSTART_URLS = """
from django.http import HttpResponse
from django_redis_lock import prevent_double_submit


@prevent_double_submit()
def checkout(request):
    return HttpResponse("ordered")


urlpatterns += [path("checkout/", checkout)]
"""
QUICKSTART_DRIVER = """
import os, subprocess, sys
import django
os.environ["DJANGO_SETTINGS_MODULE"] = "shop.settings"
django.setup()
from django.contrib.auth.models import User
from django.test import Client
from django_redis_lock import Lock

User.objects.create_superuser("admin", "admin@example.com", "pw")
client = Client()
assert client.post("/checkout/", {"item": "1"}).content == b"ordered"
assert client.login(username="admin", password="pw")
with Lock("quickstart:report", label="nightly report"):
    page = client.get("/admin/django_redis_lock/heldlock/")
    assert page.status_code == 200, page.status_code
    assert "quickstart:report" in page.content.decode()
    listed = subprocess.run(
        [sys.executable, "manage.py", "redis_locks", "list"], capture_output=True, text=True
    )
    assert "quickstart:report" in listed.stdout, listed.stdout + listed.stderr
print("quickstart works")
"""


def test_the_wheel_alone_installs_imports_and_runs_the_quickstart(
    wheel_python, tmp_path, redis_url
):
    """One test, so that the venv is made once (a pip install of Django and its company)."""
    python = wheel_python
    # No extra is installed: the tasks module imports all the same (Celery's autodiscovery
    # imports it in a project with the celery extra alone).
    probe = (
        "import django_redis_lock, django_redis_lock.tasks, importlib.resources as r;"
        "print(django_redis_lock.__version__);"
        "print(r.files('django_redis_lock').joinpath('py.typed').is_file())"
    )
    result = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    version, typed = result.stdout.split()
    assert version == __import__("django_redis_lock").__version__
    assert typed == "True"

    # (Not the suite's settings nor its path: the project's own, as a user's.)
    env = {
        k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")
    }

    def run(*args, cwd=tmp_path):
        done = subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
        assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    run(python, "-m", "django", "startproject", "shop", ".", cwd=tmp_path)
    with open(tmp_path / "shop" / "settings.py", "a", encoding="utf-8") as settings:
        settings.write(QUICKSTART_SETTINGS.format(redis_url=redis_url))
    with open(tmp_path / "shop" / "urls.py", "a", encoding="utf-8") as urls:
        urls.write(QUICKSTART_URLS)
    run(python, "manage.py", "migrate", "--verbosity", "0")
    # (A new project's own deploy findings fail it on Django 6.1: its console e-mail backend.
    # Ours must have nothing to say.)
    checked = run(python, "manage.py", "check", "--deploy", "--fail-level", "CRITICAL")
    assert "django_redis_lock." not in checked.stdout + checked.stderr
    assert run(python, "-c", QUICKSTART_DRIVER).stdout.strip() == "quickstart works"
