"""The Locks panel in a real django-debug-toolbar: a request that waits for a held lock shows
its wait, the holder it waited for, and every other outcome; nothing is recorded outside a
toolbar request."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading

import pytest
from django.test import AsyncClient

from django_redis_lock import Lock, aclose_async_redis_clients, signals
from django_redis_lock.primitives.keys import lock_keys
from tests.support.helpers import wait_until

TOOLBAR = "debug_toolbar.middleware.DebugToolbarMiddleware"


def show_toolbar(request):
    return True


@pytest.fixture
def toolbar(settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, TOOLBAR]
    settings.DEBUG_TOOLBAR_CONFIG = {
        "IS_RUNNING_TESTS": False,
        "SHOW_TOOLBAR_CALLBACK": "tests.django.test_debug_toolbar.show_toolbar",
        # Panels fetched from the toolbar's store, as a browser does (older toolbars would
        # render them into the page under the test client's multi-process WSGI flag).
        "RENDER_PANELS": False,
    }


class Holder(threading.Thread):
    """Holds ``toolbar:contended`` (and ``toolbar:held``) until the request's waiter is queued,
    then releases the first: the request's wait is forced, not timed."""

    def __init__(self, client) -> None:
        super().__init__(daemon=True)
        self.client, self.ready, self.error = client, threading.Event(), None

    def run(self) -> None:
        try:
            contended, held = Lock("toolbar:contended"), Lock("toolbar:held", timeout=60)
            contended.acquire()
            held.acquire()
            self.ready.set()
            queue = lock_keys("toolbar:contended", "default").queue
            wait_until(lambda: self.client.llen(queue) == 1, 30, "the request queued")
            contended.release()
        except BaseException as error:  # (reported by the test)
            self.error = error
            self.ready.set()


def panel_content(client, response) -> str:
    # (Toolbar 6+ names a request by its request id; 4.x and 5.x by a store id.)
    found = re.search(rb'data-(request|store)-id="([0-9a-f]+)"', response.content)
    kind, value = found.group(1).decode(), found.group(2).decode()
    rendered = client.get(
        "/__debug__/render_panel/", {f"{kind}_id": value, "panel_id": "LocksPanel"}
    )
    assert rendered.status_code == 200
    return rendered.json()["content"]


@pytest.mark.django_db
def test_the_panel_shows_each_lock_the_request_took(client, toolbar, redis_client):
    done = Lock("toolbar:done")
    done.acquire()
    done.release(result=b"kept", result_ttl=60)
    holder = Holder(redis_client)
    holder.start()
    holder.ready.wait(30)
    assert holder.error is None

    response = client.get("/toolbar/locks/")
    holder.join(30)
    assert holder.error is None
    assert response.status_code == 200
    toolbar_html = response.content.decode()
    # The side bar: seven takings (lock_many's pair counts as two), and the total wait.
    found = re.search(r"(\d+) locks?, ([0-9.]+) ms waiting", toolbar_html)
    assert found.group(1) == "7", found.group(0)
    total = float(found.group(2))
    assert f"Locks: {total:.1f} ms waiting in all" in toolbar_html  # the panel's title

    content = panel_content(client, response)
    rows = {
        re.search(r'title="([^"]+)"', row).group(1): row
        for row in re.findall(r"<tr>(.*?)</tr>", content, re.S)[1:]
    }
    assert set(rows) == {
        "toolbar:contended", "toolbar:held", "toolbar:done", "toolbar:lost", "toolbar:pool",
        "toolbar:a", "toolbar:b",
    }  # fmt: skip
    contended = rows["toolbar:contended"]
    assert "released" in contended
    assert "the contended one" in contended
    _at, waited, _held = (float(ms) for ms in re.findall(r"([0-9.]+)&nbsp;ms", contended))
    assert 0 < waited <= total
    assert f"/{os.getpid()} Thread-" in contended  # the holder it waited for: our thread
    assert "timed out" in rows["toolbar:held"]
    assert "replayed" in rows["toolbar:done"]
    assert "lost" in rows["toolbar:lost"]
    assert "its lease had ended" in rows["toolbar:lost"]  # the reason
    assert "semaphore" in rows["toolbar:pool"]
    for name in ("toolbar:pool", "toolbar:a", "toolbar:b"):
        assert "released" in rows[name]


def test_an_async_request_is_recorded_too(client, toolbar, redis_client):
    """Under ASGI (the toolbar's async middleware, an async view, the asyncio API)."""

    async def request():
        try:
            return await AsyncClient().get("/toolbar/async-locks/")
        finally:
            await aclose_async_redis_clients()

    response = asyncio.run(request())
    assert response.status_code == 200
    assert "1 lock, " in response.content.decode()
    content = panel_content(client, response)
    assert "toolbar:async" in content
    assert "released" in content


def test_nothing_listens_outside_a_toolbar_request(client, redis_client):
    with Lock("toolbar:plain"):
        pass
    for signal in (signals.lock_acquired, signals.lock_not_acquired, signals.lock_lost):
        assert not [r for r in signal.receivers if "drl-toolbar" in str(r[0])]


def test_importing_the_panel_needs_no_toolbar():
    code = (
        "import sys\n"
        "sys.modules['debug_toolbar'] = sys.modules['debug_toolbar.panels'] = None\n"
        "import django; from django.conf import settings; settings.configure(); django.setup()\n"
        "from django_redis_lock.debug_toolbar import LocksPanel\n"
        "try:\n    LocksPanel(None, None)\nexcept ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert 'pip install "django-redis-lock[debug-toolbar]"' in done.stdout
