"""The admin Locks page on a busy Redis: 100,000 unrelated keys and 1,000 locks.

    .venv/bin/python -m benchmarks.bench_admin [--keys N] [--locks N] [--output PATH]

Reports the time to render one page of 100 locks (the view and its template, no HTTP), and the
longest single SCAN call the server saw (SLOWLOG, with every command logged). Targets: a page in
at most 50 ms; no SCAN call over 1 ms. Written to ``benchmarks/results-admin.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.harness.servers import EmbeddedRedis

HERE = Path(__file__).resolve().parent

urlpatterns: list = []


def setup(url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="bench",
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.messages",
            "django.contrib.sessions",
            "django_redis_lock",
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}},
        ROOT_URLCONF=__name__,
        TEMPLATES=[
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
        ],
        STATIC_URL="/static/",
        ALLOWED_HOSTS=["*"],
    )
    django.setup()
    from django.contrib import admin
    from django.urls import path

    urlpatterns.append(path("admin/", admin.site.urls))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--locks", type=int, default=1_000)
    parser.add_argument("--renders", type=int, default=50)
    parser.add_argument("--output", type=Path, default=HERE / "results-admin.md")
    options = parser.parse_args(argv)

    with EmbeddedRedis() as server:
        setup(server.url)
        from django.contrib import admin
        from django.contrib.auth.models import User
        from django.contrib.messages.storage.fallback import FallbackStorage
        from django.test import RequestFactory

        from django_redis_lock import Lock, get_redis_client
        from django_redis_lock.models import HeldLock

        client = get_redis_client()
        pipe = client.pipeline(transaction=False)
        for index in range(options.keys):
            pipe.set(f"app:session:{index}", "x")
            if index % 5000 == 4999:
                pipe.execute()
        pipe.execute()
        held = [Lock(f"bench:{index}", timeout=600) for index in range(options.locks)]
        for lock in held:
            lock.acquire()

        model_admin = admin.site._registry[HeldLock]
        operator = User(username="operator", is_superuser=True, is_staff=True, is_active=True)
        factory = RequestFactory()

        def render() -> float:
            request = factory.get("/admin/django_redis_lock/heldlock/")
            request.user = operator
            request.session = {}
            request._messages = FallbackStorage(request)
            started = time.perf_counter()
            response = model_admin.changelist_view(request)
            response.render()
            elapsed = time.perf_counter() - started
            assert response.status_code == 200
            return elapsed * 1000

        render()  # warm up (templates compiled, scripts loaded)
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 100_000)
        client.slowlog_reset()
        renders = [render() for _ in range(options.renders)]
        entries = client.slowlog_get(100_000)
        scans = [
            entry["duration"] for entry in entries if entry["command"].upper().startswith(b"SCAN")
        ]
        version = client.info("server")["redis_version"]
        dbsize = client.dbsize()

    median = statistics.median(renders)
    worst_scan = max(scans) if scans else 0
    lines = [
        "# The admin Locks page on a busy Redis",
        "",
        f"Written by `benchmarks/bench_admin.py` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M}"
        f" UTC; redis-server {version}; {dbsize:,} keys in the database ({options.keys:,}"
        f" unrelated, {options.locks:,} locks); page size 100.",
        "",
        "| measure | value | target |",
        "| --- | --- | --- |",
        f"| render one page (median of {len(renders)}) | {median:.1f} ms | <= 50 ms |",
        f"| render one page (slowest) | {max(renders):.1f} ms | |",
        f"| SCAN calls seen by the server | {len(scans)} | |",
        f"| longest single SCAN call (SLOWLOG) | {worst_scan} us | <= 1,000 us |",
        "",
        f"- page: {'met' if median <= 50 else 'missed'}; SCAN: "
        + ("met" if worst_scan <= 1000 else "missed"),
    ]
    text = "\n".join(lines) + "\n"
    options.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
