"""Settings of the django-redis-lock example project. A demo: not for production.

Redis comes from ``REDIS_URL``; ``make demo`` (``demo.py``) sets it to an embedded, private
redis-server when you have not set it yourself, and leaves that server's URL in
``.redis/url`` while it runs, where ``manage.py`` in another terminal finds it.
"""

import importlib.util
import os
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redis_lock",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "example_project" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DEMO_DATABASE", BASE_DIR / "db.sqlite3"),
    }
}


def _demo_redis_url() -> str | None:
    """The URL of the Redis ``make demo`` started, which it writes beside that server's files
    while it runs: so that ``manage.py`` commands in another terminal use the demo's Redis, not
    whatever listens on 6379."""
    directory = Path(os.environ.get("DEMO_REDIS_DIR", BASE_DIR / ".redis"))
    try:
        return (directory / "url").read_text().strip() or None
    except OSError:
        return None


REDIS_URL = os.environ.get("REDIS_URL") or _demo_redis_url()
if not REDIS_URL:
    # Not a silent fallback to redis://127.0.0.1:6379: that may be a Redis of yours, and the
    # demo's keys do not belong there.
    raise ImproperlyConfigured(
        "The example project needs a Redis: run `make demo` (its Redis is found while it runs), "
        "or set REDIS_URL=redis://host:port/db."
    )

# The locks use this cache's Redis connection (DJANGO_REDIS_LOCK_CACHE_ALIAS = "default").
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "demo",
    }
}

DJANGO_REDIS_LOCK_TIMEOUT = 30

# django-debug-toolbar with the Locks panel (the demo installs it; DEBUG only): open the
# report page during the contention to see a request wait for a lock, and for whom.
if DEBUG and importlib.util.find_spec("debug_toolbar") and "test" not in sys.argv:
    from debug_toolbar.settings import PANELS_DEFAULTS

    INSTALLED_APPS.append("debug_toolbar")
    MIDDLEWARE.insert(0, "debug_toolbar.middleware.DebugToolbarMiddleware")
    INTERNAL_IPS = ["127.0.0.1", "::1"]
    DEBUG_TOOLBAR_PANELS = [*PANELS_DEFAULTS, "django_redis_lock.debug_toolbar.LocksPanel"]
    DEBUG_TOOLBAR_CONFIG = {"SHOW_COLLAPSED": True}  # a handle on the right, not over the page

# The demo creates an admin user demo / demo (`manage.py ensure_demo_superuser`): demo only.
DEMO_SUPERUSER = os.environ.get("DEMO_SUPERUSER", "1") == "1"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
