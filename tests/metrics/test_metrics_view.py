"""The ready ``/metrics`` view (``django_redis_lock.metrics.views.metrics``): who may read it,
and that it serves the locks' metrics, in one process and summed over several."""

from __future__ import annotations

import multiprocessing

import pytest
from django.contrib.auth.models import Permission, User
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured

from django_redis_lock import Lock
from tests.support import workers

TOKEN = "a-scraper's-token-0123456789"
pytestmark = pytest.mark.django_db


@pytest.fixture
def prometheus(settings):
    settings.DJANGO_REDIS_LOCK_METRICS = ["prometheus"]
    settings.DJANGO_REDIS_LOCK_METRICS_TOKEN = TOKEN
    yield
    settings.DJANGO_REDIS_LOCK_METRICS = []


def test_a_scraper_with_the_token_reads_the_locks_metrics(client, prometheus, redis_client):
    with Lock("scraped:1"):
        pass
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    body = response.content.decode()
    assert 'redis_lock_hold_seconds_count{group="scraped",kind="lock"}' in body
    assert "redis_lock_census_complete 1.0" in body
    assert "no-cache" in response["Cache-Control"]


def test_nobody_else_reads_them(client, prometheus):
    anonymous = client.get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"DJANGO_REDIS_LOCK_METRICS_TOKEN" in anonymous.content

    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-the-token-at-all")
    assert wrong.status_code == 401
    assert 'error="invalid_token"' in wrong["WWW-Authenticate"]

    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_a_token_is_refused_while_none_is_set(client, settings):
    settings.DJANGO_REDIS_LOCK_METRICS = ["prometheus"]
    try:
        response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer anything-at-all-12345")
        assert response.status_code == 401
    finally:
        settings.DJANGO_REDIS_LOCK_METRICS = []


def test_a_user_who_may_view_the_locks_reads_them_and_others_are_refused(client, prometheus):
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    client.force_login(user)
    refused = client.get("/metrics")
    assert refused.status_code == 403
    assert b"django_redis_lock.view_heldlock" in refused.content

    user.user_permissions.add(Permission.objects.get(codename="view_heldlock"))
    client.force_login(User.objects.get(pk=user.pk))  # (a fresh user: permissions are cached)
    assert client.get("/metrics").status_code == 200

    client.force_login(User.objects.create_superuser("root", password="pw"))
    assert client.get("/metrics").status_code == 200


def test_with_the_exporter_off_the_view_says_what_to_set(client, settings):
    settings.DJANGO_REDIS_LOCK_METRICS_TOKEN = TOKEN
    with pytest.raises(
        ImproperlyConfigured, match=r'DJANGO_REDIS_LOCK_METRICS = \["prometheus"\]'
    ):
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")


@pytest.mark.parametrize(
    ("value", "check_id"),
    [(12345678901234567890, "django_redis_lock.E004"), ("short", "django_redis_lock.E005")],
)
def test_a_bad_token_setting_is_reported(settings, value, check_id):
    settings.DJANGO_REDIS_LOCK_METRICS_TOKEN = value
    messages = {message.id: message for message in run_checks()}
    assert check_id in messages
    assert "DJANGO_REDIS_LOCK_METRICS_TOKEN" in messages[check_id].msg


def test_under_a_multi_process_server_it_serves_every_workers_sums(
    redis_url, tmp_path, monkeypatch
):
    """As under gunicorn: two workers counted into prometheus_client's files, and a third
    process's view serves their sums (and the census)."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(2) as pool:
        done = pool.starmap(
            workers.metered_locks,
            [
                (redis_url, str(tmp_path), "mpview:job", 2),
                (redis_url, str(tmp_path), "mpview:job", 3),
            ],
        )
        pool.close()
        pool.join()
    assert done == [2, 3]
    with spawn.Pool(1) as pool:
        status, body = pool.apply(workers.scraped_metrics_view, (redis_url, str(tmp_path), TOKEN))
    assert status == 200
    # 2 + 3 rounds, and each worker's holder of its timed-out wait.
    assert 'redis_lock_hold_seconds_count{group="mpview:job",kind="lock"} 7.0' in body
    assert "redis_lock_census_complete 1.0" in body
