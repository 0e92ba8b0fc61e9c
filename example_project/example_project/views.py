import os
from importlib.metadata import version

import redis
from django.conf import settings
from django.shortcuts import render

from django_redis_lock import get_redis_client
from django_redis_lock.conf import SETTINGS, lock_settings


def home(request):
    """Which Redis the locks talk to, its version, and the lock settings in force."""
    client = get_redis_client()
    connection = client.connection_pool.connection_kwargs
    try:
        server = client.info("server")
        error = None
    except redis.RedisError as exc:
        server, error = {}, f"{type(exc).__name__}: {exc}"
    context = {
        "contention": request.GET.get("contention"),
        "toolbar": "debug_toolbar" in settings.INSTALLED_APPS,
        "redis_address": "{host}:{port}/{db}".format(**{"db": 0, **connection}),
        "redis_server": server,
        "redis_error": error,
        "embedded_binary": os.environ.get("DEMO_EMBEDDED_REDIS"),
        "lock_settings": [
            (setting.full_name, lock_settings.raw(name), setting.doc)
            for name, setting in SETTINGS.items()
        ],
        "versions": {
            package: version(package)
            for package in ("django-redis-lock", "Django", "django-redis", "redis")
        },
    }
    return render(request, "home.html", context, status=503 if error else 200)
