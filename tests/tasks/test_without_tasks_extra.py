"""A project that installed only the ``celery`` extra: Django before 6.0 without the
django-tasks backport. Celery's ``app.autodiscover_tasks()`` imports every installed app's
``tasks`` module, ``django_redis_lock.tasks`` among them; a worker that cannot import it exits
(issue 27). Each test runs a child Python in which the backport cannot be imported
(``tests/hiding/sitecustomize.py``), with ``tests/settings_celery_only.py``."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import uuid

import django
import pytest
from celery import Celery

from tests.support.task_workers import ROOT, celery_worker

BACKPORT = "django_tasks,django_tasks_db"
# On Django 6.0+ the guards use django.tasks, part of Django: hidden too, no framework is left.
NO_FRAMEWORK = f"{BACKPORT},django.tasks"
INSTALL = 'pip install "django-redis-lock[tasks]"'
SOON = 30


def hidden_env(hidden: str) -> dict[str, str]:
    """The environment of a child Python in which ``hidden`` cannot be imported."""
    path = [str(ROOT / "tests" / "hiding"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, path)),
        "DJANGO_REDIS_LOCK_TEST_HIDDEN": hidden,
        "DJANGO_SETTINGS_MODULE": "tests.settings_celery_only",
    }


def run_without(hidden: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python *args`` in a child Python in which ``hidden`` cannot be imported."""
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**os.environ, **hidden_env(hidden)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def output_of(hidden: str, code: str) -> object:
    """What ``code``, run in such a child, printed as its last line (JSON); it must succeed."""
    child = run_without(hidden, "-c", code)
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout.splitlines()[-1])


def test_the_backport_is_hidden_and_our_tasks_module_imports():
    printed = output_of(
        BACKPORT,
        """if True:
        import importlib.util, json
        import django
        django.setup()
        try:
            import django_tasks
            backport = "imported"
        except ModuleNotFoundError as error:
            backport = str(error)
        from django_redis_lock.task_guards import framework as task_framework
        from django_redis_lock.tasks import GuardedBackend, guard_of, guarded
        print(json.dumps({
            "backport": backport,
            "found": importlib.util.find_spec("django_tasks_db") is not None,
            "framework": task_framework.MODULE,
        }))
        """,
    )
    assert printed == {
        "backport": "No module named 'django_tasks'",
        "found": False,
        # Django 6.0+ brings its own: the backport is not needed there.
        "framework": "django.tasks" if django.VERSION >= (6, 0) else None,
    }


def test_celery_autodiscovery_imports_every_installed_apps_tasks_module():
    """What a starting worker does: the Django fixup sets Django up, then the tasks modules of
    ``INSTALLED_APPS`` are imported, ours among them."""
    printed = output_of(
        BACKPORT,
        """if True:
        import json, sys
        from tests.support.celery_project import app
        app.loader.import_default_modules()
        print(json.dumps(sorted(name for name in sys.modules if name.endswith(".tasks"))))
        """,
    )
    assert "django_redis_lock.tasks" in printed


def test_manage_py_check_passes():
    child = run_without(BACKPORT, "-m", "django", "check")
    assert child.returncode == 0, child.stderr
    assert "System check identified no issues" in child.stdout


def test_using_the_guards_says_what_to_install():
    printed = output_of(
        NO_FRAMEWORK,
        """if True:
        import json
        import django
        django.setup()
        from django.core.exceptions import ImproperlyConfigured
        from django_redis_lock.tasks import GuardedBackend, guarded
        errors = {}
        for what, use in [
            ("guarded", lambda: guarded(guard_key="{customer_id}")),
            ("backend", lambda: GuardedBackend("default", {"OPTIONS": {"INNER": "db"}})),
        ]:
            try:
                use()
                errors[what] = None
            except ImproperlyConfigured as error:
                errors[what] = str(error)
        print(json.dumps(errors))
        """,
    )
    assert printed["guarded"].startswith("@guarded(...) needs Django's tasks framework")
    assert printed["backend"].startswith("TASKS['default'], a GuardedBackend, needs Django's")
    for message in printed.values():
        assert INSTALL in message
        assert "Django 6.0+" in message


@pytest.fixture
def client(broker_url):
    """A Celery client of the worker's broker."""
    app = Celery("client", broker=broker_url, backend=broker_url, set_as_current=False)
    yield app
    gc.collect()  # its results unsubscribe while the broker is up (see test_celery.py)
    app.close()


@pytest.mark.workers
def test_a_worker_starts_and_runs_a_guarded_task(client, broker_url, redis_url, tmp_path):
    # A queue of its own: test_celery.py's worker, on the same broker, knows no such task.
    worker = celery_worker(
        tmp_path / "worker.log", broker_url, redis_url, queue="celery-only",
        app="tests.support.celery_project", **hidden_env(BACKPORT),
    )  # fmt: skip
    worker.start()  # it exited at once when it could not import django_redis_lock.tasks
    try:
        result = client.send_task(
            "tests.support.celery_project.holder_of_its_guard", args=[uuid.uuid4().hex],
            queue="celery-only",
        )  # fmt: skip
        assert result.get(timeout=SOON) == result.id
    finally:
        worker.stop()
