"""@prevent_double_submit on Django REST framework's views, with real DRF and real requests."""

from __future__ import annotations

import json
import logging
import secrets
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from django_redis_lock import lock_contended
from tests.conftest import django_redis_caches
from tests.support.helpers import wait_until
from tests.testapp import views
from tests.testapp.drf_views import StreamParser

# Each way a DRF user decorates a view (tests/testapp/drf_views.py): its URL, the name it runs
# as, and its group (by default the decorated handler's dotted name).
DECORATED = {
    "api_view function": ("/api/order/", "api_order", "drf_views.api_order"),
    "APIView, method_decorator": (
        "/api/order-view/", "order_api_view", "drf_views.OrderAPIView.post"
    ),
    "ViewSet create": ("/api/orders/", "order_viewset_create", "drf_views.OrderViewSet.create"),
    "ViewSet action": ("/api/orders/7/pay/", "order_viewset_pay:7", "drf_views.OrderViewSet.pay"),
}  # fmt: skip
each_view = pytest.mark.parametrize(
    ("path", "name", "group"), DECORATED.values(), ids=DECORATED.keys()
)


@pytest.fixture(autouse=True)
def _fresh_views():
    views.runs.clear()
    views.gate.set()
    yield
    views.gate.set()


def post(path, data=None, client=None, **headers):
    """A JSON POST, as a DRF client sends it."""
    client = client or APIClient(raise_request_exception=False)
    headers.setdefault("HTTP_X_CLIENT", "client-1")
    return client.post(path, {"item": "book"} if data is None else data, format="json", **headers)


@each_view
def test_the_view_runs_once_and_answers_its_own_response(path, name, group):
    # Before DRF's Response had its renderer, keeping it for duplicates failed: the view ran,
    # then answered 500 (".accepted_renderer not set on Response"), and the retry ran it again.
    first = post(path)
    retry = post(path)
    assert first.status_code == 201, first.content
    assert first["Content-Type"] == "application/json"
    assert first.json()["item"] == "book"
    assert retry.status_code == 201
    assert retry.content == first.content  # the first run's order, replayed
    assert retry["Content-Type"] == "application/json"
    assert retry["Idempotent-Replayed"] == "true"
    assert views.runs == {name: 1}


@each_view
def test_the_json_body_is_part_of_the_submission(path, name, group):
    book = post(path, {"item": "book", "count": 1})
    pen = post(path, {"item": "pen", "count": 1})
    book_again = post(path, {"item": "book", "count": 1})
    assert book.wsgi_request.content_type == "application/json"
    assert pen.status_code == book.status_code == 201
    assert pen.json()["item"] == "pen"
    assert "Idempotent-Replayed" not in pen
    assert book_again.content == book.content
    assert book_again["Idempotent-Replayed"] == "true"
    assert views.runs == {name: 2}


def test_a_form_post_is_fingerprinted_from_what_drf_parsed():
    def send(item):
        client = APIClient(raise_request_exception=False)
        return client.post("/api/order-view/", {"item": item}, HTTP_X_CLIENT="c1")  # multipart

    first, replayed, other = send("book"), send("book"), send("pen")
    assert first.status_code == 201
    assert replayed.content == first.content
    assert replayed["Idempotent-Replayed"] == "true"
    assert other.json()["item"] == "pen"
    assert views.runs == {"order_api_view": 2}


@pytest.mark.django_db
@pytest.mark.parametrize("content_type", ["application/json", StreamParser.media_type])
def test_a_session_user_s_body_parsed_by_drf_before_the_handler(content_type):
    # SessionAuthentication's CSRF check reads request.POST, which makes DRF parse the body
    # before the handler. A parser that reads the stream (DRF's own before 3.16; StreamParser)
    # leaves request.body unreadable: it raised RawPostDataException, a 500 before the view.
    user = get_user_model().objects.create_user("alice")
    client = APIClient(enforce_csrf_checks=True, raise_request_exception=False)
    client.force_login(user)
    token = secrets.token_hex(16)  # a CSRF secret: 32 characters, as cookie and header
    client.cookies["csrftoken"] = token

    def send(data):
        return client.post(
            "/api/session-order/", json.dumps(data), content_type=content_type,
            HTTP_X_CSRFTOKEN=token,
        )  # fmt: skip

    first, replayed, other = send({"item": "book"}), send({"item": "book"}), send({"item": "pen"})
    assert first.status_code == 201, first.content
    assert replayed.content == first.content
    assert replayed["Idempotent-Replayed"] == "true"
    assert other.status_code == 201
    assert other.json()["item"] == "pen"
    assert views.runs == {"session_order_api_view": 2}
    # And the CSRF check still refuses a request without the token, before any lock.
    refused = client.post("/api/session-order/", "{}", content_type=content_type)
    assert refused.status_code == 403
    assert views.runs == {"session_order_api_view": 2}


@each_view
def test_a_duplicate_while_the_first_runs_gets_409_json(path, name, group):
    views.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(post, path)
        wait_until(lambda: views.runs[name], 10, "the first request inside the view")
        as_json = post(path, HTTP_ACCEPT="application/json")
        as_html = post(path, HTTP_ACCEPT="text/html")
        views.gate.set()
        first = running.result(30)
    assert first.status_code == 201
    assert as_json.status_code == 409
    assert as_json.json()["error"] == "duplicate_submission"
    assert 1 <= int(as_json["Retry-After"]) <= 5
    assert as_html.status_code == 409
    assert "Already submitted" in as_html.content.decode()
    assert views.runs == {name: 1}


def test_a_waiting_duplicate_gets_the_first_response(caplog):
    queued = threading.Semaphore(0)

    def on_contended(**kwargs):
        if kwargs["label"].endswith(".PatientAPIView.post"):
            queued.release()

    lock_contended.connect(on_contended, weak=False, dispatch_uid="drf-patient")
    views.gate.clear()
    try:
        with ThreadPoolExecutor(3) as pool, caplog.at_level(logging.WARNING):
            running = pool.submit(post, "/api/patient/")
            wait_until(lambda: views.runs["patient_api_view"], 10, "the first request inside")
            waiting = [pool.submit(post, "/api/patient/") for _ in range(2)]
            for _ in range(2):  # both wait for the first one
                assert queued.acquire(timeout=10)
            views.gate.set()
            first = running.result(30)
            duplicates = [future.result(30) for future in waiting]
    finally:
        lock_contended.disconnect(dispatch_uid="drf-patient")
    statuses = [response.status_code for response in (first, *duplicates)]
    assert views.runs["patient_api_view"] == 1, (statuses, caplog.text)
    assert statuses == [201, 201, 201]
    assert all(response.content == first.content for response in duplicates)
    assert all(response["Idempotent-Replayed"] == "true" for response in duplicates)


@each_view
def test_redis_down_answers_503_json_from_inside_drf(settings, caplog, path, name, group):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")  # nothing listens there
    response = post(path, HTTP_ACCEPT="application/json")
    assert response.status_code == 503
    assert response.json()["error"] == "service_unavailable"
    assert response["Retry-After"] == "5"
    assert views.runs == {}
    [warning] = [r.getMessage() for r in caplog.records if r.name == "django_redis_lock"]
    assert warning.startswith(
        f"Answering 503 to a submission to tests.testapp.{group} ({path}), Redis is unavailable"
    )
    assert "ConnectionError" in warning


def test_our_modules_import_without_drf_and_never_import_it():
    # DRF is optional: with it missing (an import of it fails), every module of ours imports,
    # and none imports DRF when it is there (it is only asked for when the process loaded it).
    code = """
import importlib, pkgutil, sys
blocked = "--without" in sys.argv
if blocked:
    sys.modules["rest_framework"] = None  # `import rest_framework` raises ImportError
import django
from django.conf import settings
settings.configure(INSTALLED_APPS=[
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", "django_redis_lock",
])
django.setup()
import django_redis_lock
names = [m.name for m in pkgutil.walk_packages(django_redis_lock.__path__, "django_redis_lock.")]
for name in names:
    importlib.import_module(name)
from django.http import HttpResponse
from django_redis_lock.guards import drf
assert not drf.is_request(object()) and not drf.unfinalized(HttpResponse())
print(len(names), "rest_framework" in sys.modules and sys.modules["rest_framework"] is not None)
"""
    for flag in ("--without", "--with"):
        done = subprocess.run(
            [sys.executable, "-c", code, flag], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        count, drf_loaded = done.stdout.split()
        assert int(count) > 40
        assert drf_loaded == "False", flag
