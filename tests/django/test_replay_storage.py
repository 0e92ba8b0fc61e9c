"""What @prevent_double_submit keeps for replays is bounded, and never crosses clients that
only an IP address tells apart."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from tests.testapp import views

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_views():
    views.runs.clear()


def post_report(client_id, key, size=60_000):
    return Client().post(
        "/report/", {"size": size}, HTTP_X_CLIENT=client_id, HTTP_IDEMPOTENCY_KEY=key
    )


def kept_bytes(redis_client):
    """Bytes of responses kept for replay, all clients."""
    return sum(redis_client.strlen(key) for key in redis_client.scan_iter("lock:{*}:r"))


def test_one_client_cannot_fill_redis_with_replays(redis_client, caplog):
    """The issue's probe, scaled down: before, 300 POSTs with distinct Idempotency-Keys to a
    60 KB view stored 24.7 MB, each for 24 h."""
    for number in range(40):  # ~3.2 MB of responses with their encoding
        assert post_report("greedy", f"key-{number}").status_code == 200
    assert views.runs["report"] == 40
    assert kept_bytes(redis_client) <= 1_048_576  # DJANGO_REDIS_LOCK_REPLAY_CLIENT_MAX_BYTES
    assert any("Not keeping the response" in r.getMessage() for r in caplog.records)
    # The first responses are replayed; the ones over the budget are not run again either.
    first = post_report("greedy", "key-0")
    assert first["Idempotent-Replayed"] == "true"
    assert len(first.content) == 60_000
    late = post_report("greedy", "key-39")
    assert late.status_code == 409
    assert views.runs["report"] == 40
    # Another client has a budget of its own.
    assert post_report("modest", "key-0").status_code == 200
    assert post_report("modest", "key-0")["Idempotent-Replayed"] == "true"


def test_the_total_budget_bounds_all_clients_together(settings, redis_client):
    settings.DJANGO_REDIS_LOCK_REPLAY_TOTAL_MAX_BYTES = 50_000
    for client_id in ("a", "b", "c", "d"):
        assert post_report(client_id, "k", size=10_000).status_code == 200
    replayed = [
        post_report(client_id, "k", size=10_000).status_code == 200 for client_id in "abcd"
    ]
    assert replayed == [True, True, True, False]  # each record is ~13.4 KB base64-encoded
    assert kept_bytes(redis_client) <= 50_000


def test_the_budget_window_is_the_time_responses_are_kept(redis_client):
    post_report("someone", "k", size=100)
    [budget] = list(redis_client.scan_iter("lock:{!replay-budget}:*"))
    assert budget.endswith(b":86400000")  # idempotency_ttl: 24 h
    assert 0 < redis_client.pttl(budget) <= 86_400_000


def test_a_zero_budget_keeps_no_response(settings, redis_client):
    settings.DJANGO_REDIS_LOCK_REPLAY_CLIENT_MAX_BYTES = 0
    assert post_report("nobody", "k", size=100).status_code == 200
    assert post_report("nobody", "k", size=100).status_code == 409  # not run twice
    assert kept_bytes(redis_client) < 200  # the record says it ran, without the response


@pytest.mark.parametrize("path", ["/anonymous-payment/", "/session-payment/"])
def test_two_people_behind_one_address_never_get_each_others_response(path, caplog):
    """Two anonymous visitors behind one NAT (same REMOTE_ADDR, no session yet) send the same
    Idempotency-Key and body: before, the second got the first's receipt."""
    alice, bob = Client(), Client()
    first = alice.post(path, {"payer": "same"}, HTTP_IDEMPOTENCY_KEY="shared-key")
    assert first.status_code == 200
    second = bob.post(path, {"payer": "same"}, HTTP_IDEMPOTENCY_KEY="shared-key")
    assert second.status_code == 409  # still not run twice for what looks like one client
    assert first.content not in second.content
    assert "Idempotent-Replayed" not in second


def test_logged_in_users_still_get_their_replays(django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_user("payer"))
    first = client.post("/anonymous-payment/", {"payer": "me"}, HTTP_IDEMPOTENCY_KEY="k")
    again = client.post("/anonymous-payment/", {"payer": "me"}, HTTP_IDEMPOTENCY_KEY="k")
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content


def test_a_budget_refusal_is_logged_once_per_response(settings, caplog):
    settings.DJANGO_REDIS_LOCK_REPLAY_CLIENT_MAX_BYTES = 10
    caplog.set_level(logging.WARNING, "django_redis_lock")
    post_report("tiny", "k", size=100)
    warnings = [r for r in caplog.records if "Not keeping the response" in r.getMessage()]
    assert len(warnings) == 1
    assert "client's budget" in warnings[0].getMessage()
