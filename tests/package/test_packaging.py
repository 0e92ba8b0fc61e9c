"""The built sdist and wheel carry everything, and the wheel installs into a clean venv."""

from __future__ import annotations

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
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


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


def test_wheel_installs_into_a_clean_venv_and_imports(dist, tmp_path):
    [wheel] = dist.glob("*.whl")
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    # No extra is installed: the tasks module imports all the same (Celery's autodiscovery
    # imports it in a project with the celery extra alone).
    probe = (
        "import django_redis_lock, django_redis_lock.tasks, importlib.resources as r;"
        "print(django_redis_lock.__version__);"
        "print(r.files('django_redis_lock').joinpath('py.typed').is_file())"
    )
    result = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    version, typed = result.stdout.split()
    assert version == __import__("django_redis_lock").__version__
    assert typed == "True"
