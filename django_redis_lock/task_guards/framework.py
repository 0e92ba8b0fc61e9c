"""Which tasks framework ``django_redis_lock.tasks`` guards: ``django.tasks`` (Django 6.0+),
else the ``django-tasks`` backport (the ``tasks`` extra), else none.

None must still import: Celery's ``app.autodiscover_tasks()`` imports the ``tasks`` module of
every installed app, ours included, in projects that installed only the ``celery`` extra (a
worker that cannot import it exits). The stand-ins below then take the framework's names, and
using them (``@guarded``, a ``GuardedBackend``) raises ``ImproperlyConfigured`` saying what to
install. Finding the framework imports none of it: the backport patches django-stubs' generic
classes as it is imported, which a project that does not use it should not get from us.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

from django.core.exceptions import ImproperlyConfigured

__all__ = ["INSTALL", "MODULE", "missing"]

INSTALL = 'pip install "django-redis-lock[tasks]"'


def _module() -> str | None:
    for name in ("django.tasks", "django_tasks"):
        if find_spec(name) is not None:
            return name
    return None


#: ``"django.tasks"``, ``"django_tasks"`` (the backport), or None: neither is installed.
MODULE = _module()


def missing(what: str) -> ImproperlyConfigured:
    """The error of using ``what`` with no tasks framework installed."""
    return ImproperlyConfigured(
        f"{what} needs Django's tasks framework: django.tasks, part of Django 6.0+, or before "
        f"it the django-tasks backport, which is not installed. Install it with {INSTALL}, or "
        f"upgrade to Django 6.0+."
    )


# -- stand-ins for the framework's names, when there is none -------------------------------


class BaseTaskBackend:
    """A ``GuardedBackend``'s base class: one cannot be made."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        raise missing(f"TASKS[{alias!r}], a GuardedBackend,")


# Nothing is one of these without the framework: ``tasks.py`` only tests for them.
class Task: ...


class TaskContext: ...


class TaskResult: ...


class TaskResultDoesNotExist(Exception): ...


task_backends: dict[str, Any] = {}
