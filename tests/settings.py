"""Django settings for the test suite.

The cache LOCATION is a placeholder: ``conftest.py`` starts a private redis-server (or reads
``REDIS_URL``) and points CACHES at it for the whole session before any test runs.
"""

import importlib.util
import os
import tempfile

SECRET_KEY = "django-redis-lock-tests"
DEBUG = False
USE_TZ = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django_redis_lock",
    "tests.testapp",
    "rest_framework",  # @prevent_double_submit on Django REST framework's views (test_drf.py)
    # The Locks panel (test_debug_toolbar.py); its middleware is added by that test only.
    "debug_toolbar",
]
DEBUG_TOOLBAR_PANELS = [
    "debug_toolbar.panels.timer.TimerPanel",
    "debug_toolbar.panels.sql.SQLPanel",
    "django_redis_lock.debug_toolbar.LocksPanel",
]
# (The toolbar shows only where a test says so: its middleware, SHOW_TOOLBAR_CALLBACK.)
DEBUG_TOOLBAR_CONFIG = {"IS_RUNNING_TESTS": False}
SILENCED_SYSTEM_CHECKS = ["debug_toolbar.W001"]  # its middleware is that test's own

# Django's tasks framework (the django-tasks backport before Django 6.0): tasks guarded by
# django_redis_lock.tasks, queued in the database and run by django-tasks-db's db_worker.
if importlib.util.find_spec("django_tasks_db"):
    if not importlib.util.find_spec("django.tasks"):
        INSTALLED_APPS.append("django_tasks")
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {
        "default": {
            "BACKEND": "django_redis_lock.tasks.GuardedBackend",
            "OPTIONS": {"INNER": "db"},
        },
        # "solo": for the workers a test starts (and kills) itself.
        "db": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default", "solo"]},
        # Runs a task as it is queued, in the queueing process.
        "immediate": {
            "BACKEND": "django_redis_lock.tasks.GuardedBackend",
            "OPTIONS": {"INNER": "immediate-inner"},
        },
        "immediate-inner": {
            "BACKEND": (
                "django.tasks" if importlib.util.find_spec("django.tasks") else "django_tasks"
            )
            + ".backends.immediate.ImmediateBackend"
        },
    }

# A file, not :memory:, so that the processes of the multi-process tests share the test
# database; they are told its name through DJANGO_REDIS_LOCK_TEST_DB.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DJANGO_REDIS_LOCK_TEST_DB", ":memory:"),
        "TEST": {
            "NAME": os.path.join(tempfile.gettempdir(), f"django-redis-lock-{os.getpid()}.sqlite3")
        },
    }
}

# Port 1 on loopback: nothing listens there, so a test that forgot the fixtures fails loudly
# instead of touching a server the suite did not start. Subprocesses started by the tests get
# the session's server through DJANGO_REDIS_LOCK_TEST_REDIS_URL.
UNREACHABLE_REDIS_URL = "redis://127.0.0.1:1/0"
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get("DJANGO_REDIS_LOCK_TEST_REDIS_URL", UNREACHABLE_REDIS_URL),
    }
}

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.testapp.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ALLOWED_HOSTS = ["*"]
STATIC_URL = "/static/"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
