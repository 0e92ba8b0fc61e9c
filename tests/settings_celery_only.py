"""``tests.settings`` as a project that installed only the ``celery`` extra has them
(``tests/tasks/test_without_tasks_extra.py``): no ``tests.testapp``, whose ``tasks`` module defines
django.tasks tasks, and Celery configured from Django's settings, as Celery's guide to Django
does it (``tests/support/celery_project.py``). Run where the django-tasks packages cannot be
imported, ``tests.settings`` leaves ``TASKS`` out."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, UNREACHABLE_REDIS_URL

# Nor the Debug Toolbar: on Django 6 it imports django.tasks, which these tests hide.
INSTALLED_APPS = [app for app in INSTALLED_APPS if app not in ("tests.testapp", "debug_toolbar")]

CELERY_BROKER_URL = os.environ.get("DJANGO_REDIS_LOCK_TEST_BROKER_URL", UNREACHABLE_REDIS_URL)
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
