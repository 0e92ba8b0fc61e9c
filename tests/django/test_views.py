"""@prevent_double_submit and PreventDoubleSubmitMixin, with real concurrent requests."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connections
from django.test import AsyncClient, Client

from django_redis_lock import aclose_async_redis_clients, lock_contended, prevent_double_submit
from tests.conftest import django_redis_caches
from tests.support.helpers import keys_left, run_async, wait_until
from tests.testapp import views

CLIENT = {"HTTP_X_CLIENT": "client-1"}


@pytest.fixture(autouse=True)
def _fresh_views():
    views.runs.clear()
    views.gate.set()
    views.async_gate.clear()
    yield
    views.gate.set()


def post(path, data=None, client_id="client-1", **headers):
    return Client().post(path, data or {"item": "book"}, HTTP_X_CLIENT=client_id, **headers)


def while_first_runs(path, duplicates, send):
    """Start one request that blocks in the view, send ``duplicates`` more with ``send`` while
    it runs, then let it finish; returns (first response, the duplicates' responses)."""
    views.gate.clear()
    with ThreadPoolExecutor(duplicates + 1) as pool:
        first = pool.submit(send)
        deadline = time.monotonic() + 10
        while sum(views.runs.values()) == 0 and time.monotonic() < deadline:
            time.sleep(0.005)  # until the first request is inside the view
        others = [pool.submit(send) for _ in range(duplicates)]
        responses = [future.result(30) for future in others]
        views.gate.set()
        return first.result(30), responses


# -- over HTTP, against a live threaded server -----------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_identical_posts_run_the_view_once(live_server):
    url = f"{live_server.url}/order/"
    body = urllib.parse.urlencode({"item": "book"}).encode()

    def send():
        request = urllib.request.Request(url, body, headers={"X-Client": "c1"})
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(request, timeout=30) as response:
                return response.status, dict(response.headers)
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers)

    first, duplicates = while_first_runs("/order/", 19, send)
    assert views.runs["order"] == 1
    assert first[0] == 302
    assert [status for status, _ in duplicates] == [409] * 19
    assert all(1 <= int(headers["Retry-After"]) <= 5 for _, headers in duplicates)  # hold = 5


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


# -- in-process ------------------------------------------------------------------------------


def test_double_click_300ms_apart_runs_once_and_replays_the_first_response():
    first = post("/order/")
    time.sleep(0.3)  # the second click, 300 ms later, after the first finished
    second = post("/order/")
    assert views.runs["order"] == 1
    assert first.status_code == second.status_code == 302
    assert second["Location"] == first["Location"]
    assert second["Idempotent-Replayed"] == "true"
    assert "secret" in first.cookies
    assert "secret" not in second.cookies  # cookies are never replayed


def test_a_different_submission_runs():
    post("/order/", {"item": "book"})
    post("/order/", {"item": "pen"})
    post("/order/?gift=1", {"item": "book"})
    assert views.runs["order"] == 3


def test_different_clients_never_block_each_other():
    def send(client_id):
        return post("/order/", client_id=client_id)

    views.gate.clear()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(send, "alice")
        while views.runs["order"] == 0:
            time.sleep(0.005)
        second = pool.submit(send, "bob")
        while views.runs["order"] == 1:
            time.sleep(0.005)
        views.gate.set()
        assert first.result(10).status_code == second.result(10).status_code == 302
    assert views.runs["order"] == 2


@contextlib.contextmanager
def queued_for(view):
    """A semaphore released each time a request to ``view`` (its dotted name's end) starts to
    wait in line for the first one's lock."""
    queued = threading.Semaphore(0)

    def on_contended(**kwargs):
        # Only this view's lock: a thread another test left behind may wait for some other.
        if kwargs["label"].endswith(view):
            queued.release()

    lock_contended.connect(on_contended, weak=False, dispatch_uid=f"queued-for-{view}")
    try:
        yield queued
    finally:
        lock_contended.disconnect(dispatch_uid=f"queued-for-{view}")


@pytest.mark.django_db(transaction=True)
def test_users_are_told_apart_by_default():
    user_model = get_user_model()
    alice = user_model.objects.create_user("alice")
    bob = user_model.objects.create_user("bob")

    def send(user):
        try:
            client = Client()
            client.force_login(user)
            return client.post("/order-by-user/", {"item": "book"})
        finally:
            connections.close_all()  # this thread's own database connection

    views.gate.clear()
    with ThreadPoolExecutor(3) as pool, queued_for(".order_by_user") as queued:
        first = pool.submit(send, alice)
        wait_until(lambda: views.runs, 10, "alice's first request inside the view")
        other_user = pool.submit(send, bob)
        wait_until(lambda: len(views.runs) == 2, 10, "bob's request inside the view")
        # Alice's double click: a user is one person, so it waits for her first request.
        same_user = pool.submit(send, alice)
        assert queued.acquire(timeout=10)
        views.gate.set()
        assert first.result(10).status_code == 200
        assert other_user.result(10).status_code == 200
        replayed = same_user.result(10)
    assert replayed.status_code == 200
    assert replayed["Idempotent-Replayed"] == "true"
    assert views.runs == {f"order_by_user:{alice.pk}": 1, f"order_by_user:{bob.pk}": 1}


def test_safe_methods_pass_through_untouched(redis_client):
    client = Client()
    for _ in range(3):
        assert client.get("/mixin/", HTTP_X_CLIENT="c1").status_code == 200
    assert views.runs["mixin_view_get"] == 3
    assert keys_left(redis_client) == []  # not even looked up


def test_duplicate_while_running_gets_409_html_or_json():
    views.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(post, "/order/")
        while views.runs["order"] == 0:
            time.sleep(0.005)
        html = post("/order/", HTTP_ACCEPT="text/html")
        as_json = post("/order/", HTTP_ACCEPT="application/json")
        views.gate.set()
        running.result(10)
    assert html.status_code == 409
    assert "Already submitted" in html.content.decode()
    assert as_json.status_code == 409
    assert json.loads(as_json.content)["error"] == "duplicate_submission"
    assert int(as_json["Retry-After"]) >= 1


def test_a_duplicate_does_not_wait_for_a_lease_that_is_not_renewed():
    """With a fixed ``timeout`` the first request's lease may end while it runs: a duplicate
    waiting in line would take it then, and run the view a second time."""
    with queued_for(".fixed_lease") as queued:
        _, [duplicate] = while_first_runs("/fixed-lease/", 1, lambda: post("/fixed-lease/"))
    assert duplicate.status_code == 409
    assert not queued.acquire(timeout=0), "the duplicate waited in line"
    assert views.runs["fixed_lease"] == 1


@pytest.mark.django_db(transaction=True)
def test_an_async_view_tells_a_logged_in_user_by_default(settings):
    """``request.user`` loads the session from the database, which Django refuses in the
    event loop: who submits is found in a thread (it was a 500)."""
    client = Client()
    client.force_login(get_user_model().objects.create_user("alice"))
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value

    async def main():
        browser = AsyncClient()
        browser.cookies[settings.SESSION_COOKIE_NAME] = cookie
        first = await browser.post("/async-order-by-user/", {"item": "book"})
        again = await browser.post("/async-order-by-user/", {"item": "book"})
        return first, again

    first, again = run_async(main())
    assert first.status_code == 200
    assert again.content == first.content  # a user is one person: replayed
    assert again["Idempotent-Replayed"] == "true"
    assert sum(views.runs.values()) == 1


def test_waiting_duplicate_gets_the_first_response(caplog):
    views.gate.clear()
    with (
        queued_for(".patient") as queued,
        ThreadPoolExecutor(4) as pool,
        caplog.at_level(logging.WARNING),
    ):
        running = pool.submit(post, "/patient/")
        wait_until(lambda: views.runs["patient"], 10, "the first request inside the view")
        waiting = [pool.submit(post, "/patient/") for _ in range(3)]
        for _ in range(3):  # all three are waiting for the first one
            assert queued.acquire(timeout=10)
        views.gate.set()
        first = running.result(10)
        duplicates = [future.result(10) for future in waiting]
    # (The view ran twice in about 1 run of 125: a duplicate re-joined the queue before the
    # release's wake-up push and was granted the lock without "done". Forced deterministically
    # in tests/locks/test_handoff.py; the statuses and log say how, should it ever come back.)
    statuses = [response.status_code for response in (first, *duplicates)]
    assert views.runs["patient"] == 1, (statuses, caplog.text)
    assert first.status_code == 200
    assert [r.status_code for r in duplicates] == [200, 200, 200]
    assert all(r["Idempotent-Replayed"] == "true" for r in duplicates)


def test_idempotency_key(redis_client):
    headers = {"HTTP_IDEMPOTENCY_KEY": "k-1"}
    first = post("/payment/", {"amount": "10"}, **headers)
    again = post("/payment/", {"amount": "10"}, **headers)
    mismatch = post("/payment/", {"amount": "99"}, **headers)
    other_key = post("/payment/", {"amount": "10"}, HTTP_IDEMPOTENCY_KEY="k-2")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert json.loads(again.content) == {"paid": "10"}
    assert mismatch.status_code == 422
    assert other_key.status_code == 201
    assert views.runs["payment"] == 2
    # Nothing identifying in Redis: the key, client and payload are hashed.
    assert not any(b"k-1" in key or b"client-1" in key for key in redis_client.keys("*"))


def test_idempotency_key_in_progress_gets_409():
    headers = {"HTTP_IDEMPOTENCY_KEY": "k-3"}
    _, [duplicate] = while_first_runs("/payment/", 1, lambda: post("/payment/", **headers))
    assert duplicate.status_code == 409


def test_streaming_response_is_not_replayed():
    assert post("/stream/").status_code == 200
    second = post("/stream/")
    assert second.status_code == 409
    assert views.runs["stream"] == 1


def test_oversized_response_is_not_replayed(settings):
    settings.DJANGO_REDIS_LOCK_REPLAY_MAX_BYTES = 10
    document = b"x" * 100
    first = post("/upload/", {"document": SimpleUploadedFile("a.txt", document)})
    second = post("/upload/", {"document": SimpleUploadedFile("a.txt", document)})
    assert first.status_code == 200
    assert second.status_code == 409


def test_uploaded_files_are_part_of_the_fingerprint():
    post("/upload/", {"document": SimpleUploadedFile("a.txt", b"one")})
    replayed = post("/upload/", {"document": SimpleUploadedFile("a.txt", b"one")})
    other = post("/upload/", {"document": SimpleUploadedFile("a.txt", b"two")})
    assert replayed.content == b"one"  # the view still reads the file the fingerprint hashed
    assert replayed["Idempotent-Replayed"] == "true"
    assert other.content == b"two"
    assert views.runs["upload"] == 2


def test_a_failed_request_can_be_retried():
    client = Client(raise_request_exception=False)
    for _ in range(2):
        assert client.post("/failing/", {"a": 1}, HTTP_X_CLIENT="c1").status_code == 500
    assert views.runs["failing"] == 2


def test_custom_duplicate_view(settings):
    settings.DJANGO_REDIS_LOCK_DUPLICATE_SUBMISSION_VIEW = "tests.testapp.views.duplicate"
    _, [duplicate] = while_first_runs("/order/", 1, lambda: post("/order/"))
    assert duplicate.content == b"custom 409"


# Projects whose template engines cannot find the page's template: an API with no engine, a
# Django engine without app directories, and another engine only (as a Jinja2-only project:
# TemplateStrings is Django's own non-Django engine; jinja2 is not installed here).
WITHOUT_THE_TEMPLATE = {
    "no-engine": [],
    "django-without-app-dirs": [
        {"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": False}
    ],
    "another-engine-only": [
        {"BACKEND": "django.template.backends.dummy.TemplateStrings", "APP_DIRS": True}
    ],
}


def page_text(response) -> str:
    """A page's words, without its tags and layout."""
    body = re.sub(r"(?s)<(style|title)>.*?</\1>", "", response.content.decode())
    return " ".join(re.sub(r"<[^>]+>", " ", body).split())


def duplicates_answered(client_id: str) -> tuple:
    """A 409 (a streamed response cannot be replayed) and a 422 (an Idempotency-Key reused for
    another payment), both asked for as HTML by ``client_id``."""
    html = {"client_id": client_id, "HTTP_ACCEPT": "text/html"}
    post("/stream/", **html)
    conflict = post("/stream/", **html)
    post("/payment/", {"amount": "10"}, HTTP_IDEMPOTENCY_KEY="k-html", **html)
    mismatch = post("/payment/", {"amount": "99"}, HTTP_IDEMPOTENCY_KEY="k-html", **html)
    return conflict, mismatch


@pytest.mark.parametrize("templates", WITHOUT_THE_TEMPLATE.values(), ids=WITHOUT_THE_TEMPLATE)
def test_a_duplicate_gets_its_page_without_a_django_template_engine(settings, templates):
    with_template = [page_text(response) for response in duplicates_answered("with-template")]
    views.runs.clear()
    settings.TEMPLATES = templates
    conflict, mismatch = duplicates_answered("without")
    assert (conflict.status_code, mismatch.status_code) == (409, 422)
    assert conflict["Content-Type"] == mismatch["Content-Type"] == "text/html; charset=utf-8"
    assert "<h1>Already submitted</h1>" in conflict.content.decode()
    assert "<title>Request does not match</title>" in mismatch.content.decode()
    # The same words as the template's page (its built-in copy must not drift from it).
    assert [page_text(conflict), page_text(mismatch)] == with_template
    assert views.runs["stream"] == views.runs["payment"] == 1


def test_a_project_overrides_the_page_in_any_template_engine(settings, tmp_path):
    (tmp_path / "django_redis_lock").mkdir()
    (tmp_path / "django_redis_lock" / "duplicate_submission.html").write_text(
        "<p>Our own page: $status</p>"
    )
    settings.TEMPLATES = [
        {"BACKEND": "django.template.backends.dummy.TemplateStrings", "DIRS": [tmp_path]}
    ]
    conflict, mismatch = duplicates_answered("client-1")
    assert conflict.content == b"<p>Our own page: 409</p>"
    assert mismatch.content == b"<p>Our own page: 422</p>"


@pytest.mark.parametrize("path", ["/decorated/", "/mixin/"])
def test_class_based_views(path):
    _, [duplicate] = while_first_runs(path, 1, lambda: post(path))
    assert duplicate.status_code == 409
    assert sum(views.runs.values()) == 1


def test_disabled(settings):
    settings.DJANGO_REDIS_LOCK_ENABLED = False
    post("/stream/")
    post("/stream/")
    assert views.runs["stream"] == 2


@pytest.mark.parametrize("view", ["order", "async_order"])
@pytest.mark.parametrize("accept", ["application/json", "text/html", None])
def test_redis_down_fails_closed_with_503(settings, caplog, view, accept):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")  # nothing listens there
    path = "/" + view.replace("_", "-") + "/"
    headers = {"X-Client": "client-1", **({"Accept": accept} if accept else {})}
    # An earlier test's lock that the collector finds now would warn inside the block below.
    gc.collect()
    with caplog.at_level(logging.DEBUG, logger="django_redis_lock"):
        if view.startswith("async"):
            response = run_async(AsyncClient().post(path, {"item": "book"}, headers=headers))
        else:
            response = Client().post(path, {"item": "book"}, headers=headers)
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    if accept == "application/json":  # as the 409 answers JSON clients
        assert response["Content-Type"] == "application/json"
        assert json.loads(response.content)["error"] == "service_unavailable"
    else:
        assert response["Content-Type"] == "text/plain; charset=utf-8"
        assert response.content == b"Service unavailable, please try again."
    assert sum(views.runs.values()) == 0
    # Once, naming the view and the error (the lock itself logs nothing when Redis is down).
    [warning] = [
        record.getMessage()
        for record in caplog.records
        if record.name == "django_redis_lock" and record.levelno >= logging.WARNING
    ]
    assert f"Answering 503 to a submission to tests.testapp.views.{view} ({path})" in warning
    assert "ConnectionError" in warning
    assert "127.0.0.1:1" in warning


def test_redis_down_fails_open_when_configured(settings, caplog):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")
    settings.DJANGO_REDIS_LOCK_FAIL_OPEN = True
    assert post("/order/").status_code == 302
    assert views.runs["order"] == 1
    assert any("without double-submit protection" in r.getMessage() for r in caplog.records)


def test_bad_options_fail_when_decorating():
    with pytest.raises(ValueError, match="Unknown key"):
        prevent_double_submit("nonsense")
    with pytest.raises(ValueError, match="hold"):
        prevent_double_submit(hold=0)
    with pytest.raises(TypeError):
        prevent_double_submit(key=42)


# -- async -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/async-order/", "/async-mixin/"])
def test_async_views_under_concurrent_requests(path):
    async def main():
        views.async_gate["event"] = asyncio.Event()
        client = AsyncClient()

        async def send():
            # AsyncClient takes headers as headers=, not as HTTP_* keywords.
            return await client.post(path, {"item": "book"}, headers={"X-Client": "a1"})

        first = asyncio.create_task(send())
        while not views.runs:
            await asyncio.sleep(0.005)
        duplicates = await asyncio.gather(*(send() for _ in range(9)))
        views.async_gate["event"].set()
        first_response = await first
        replayed = await send()
        await aclose_async_redis_clients()
        return first_response, duplicates, replayed

    first, duplicates, replayed = asyncio.run(main())
    assert sum(views.runs.values()) == 1
    assert first.status_code == 200
    assert [r.status_code for r in duplicates] == [409] * 9
    assert replayed["Idempotent-Replayed"] == "true"
