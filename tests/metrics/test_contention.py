"""What is held and waited for now, read from Redis (``census.py``): the scrape-time gauges
(Prometheus and OpenTelemetry), the admin's waiters column and hot-locks page, and
``redis_locks stats`` all show the same figures."""

from __future__ import annotations

import io
import json
import re
from collections import Counter

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from django_redis_lock import Lock, Semaphore, admin, lock, prevent_double_submit
from django_redis_lock.metrics.opentelemetry import observe_census
from django_redis_lock.metrics.prometheus import CensusCollector
from django_redis_lock.primitives.keys import lock_keys, permit_keys
from django_redis_lock.registry.census import GroupFigures, take_census
from django_redis_lock.registry.locks import get_lock
from tests.support.helpers import staff, start_queued

CHANGELIST = "/admin/django_redis_lock/heldlock/"
HOT = CHANGELIST + "hot/"


@pytest.fixture
def contended(redis_client):
    """Held now: three ``import:<id>`` locks, two waiters queued for the first; a lock with a
    group of its own; semaphore ``renders`` with both permits held and one waiter."""
    held = [Lock(f"import:{n}") for n in (1, 2, 3)]
    held.append(Lock("customer:77:sync", group="billing"))
    permits = [Semaphore("renders", limit=2, label=f"render {n}") for n in (1, 2)]
    for primitive in held + permits:
        assert primitive.acquire()

    def wait_for_lock(index):
        with Lock("import:1", wait=30):
            pass

    def wait_for_permit(index):
        with Semaphore("renders", limit=2, wait=30):
            pass

    queue = lock_keys("import:1", "default").queue
    waiters = start_queued(2, wait_for_lock, redis_client, queue)
    waiters += start_queued(
        1, wait_for_permit, redis_client, permit_keys("renders", "default").queue
    )
    yield
    for primitive in held + permits:
        primitive.release()
    for waiter in waiters:
        waiter.join(30)
    assert not any(waiter.is_alive() for waiter in waiters)


def gauges(registry):
    """``{(name, kind, group): value}`` of the held and waiting gauges."""
    return {
        (sample.name, sample.labels["kind"], sample.labels["group"]): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name in ("redis_lock_held", "redis_lock_waiting")
    }


@pytest.mark.django_db
def test_the_scrape_time_gauges_equal_what_the_admin_page_lists(contended):
    registry = CollectorRegistry()
    CensusCollector(registry=registry)
    scraped = gauges(registry)
    page = staff("view_heldlock").get(CHANGELIST)
    assert page.status_code == 200
    rows = [info for info, *_ in page.context["rows"]]
    semaphores = [info for info, *_ in page.context["semaphores"]]
    listed: Counter = Counter()
    for info in rows:
        listed[("redis_lock_held", "lock", info.group)] += 1
        listed[("redis_lock_waiting", "lock", info.group)] += info.waiting
    for info in semaphores:
        listed[("redis_lock_held", "semaphore", info.group)] += len(info.holders)
        listed[("redis_lock_waiting", "semaphore", info.group)] += info.waiting
    assert scraped == dict(listed)
    # And what that is: groups by template or given, never an id.
    assert scraped == {
        ("redis_lock_held", "lock", "import"): 3,
        ("redis_lock_waiting", "lock", "import"): 2,
        ("redis_lock_held", "lock", "billing"): 1,
        ("redis_lock_waiting", "lock", "billing"): 0,
        ("redis_lock_held", "semaphore", "renders"): 2,
        ("redis_lock_waiting", "semaphore", "renders"): 1,
    }
    assert registry.get_sample_value("redis_lock_census_complete") == 1
    # The list's waiters column and its count line.
    assert {info.name: info.waiting for info in rows}["import:1"] == 2
    assert totals_of(page.content.decode()) == (
        "Held now: 4 locks, 2 waiters queued for them; 2 permits of 1 semaphore, 1 waiter "
        "queued for them. 3 waiters in all."
    )


def test_opentelemetry_observable_gauges(contended):
    reader = InMemoryMetricReader()
    observe_census(MeterProvider(metric_readers=[reader]))
    data = reader.get_metrics_data()
    points = {
        (metric.name, point.attributes["kind"], point.attributes["group"]): point.value
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    }
    assert points[("redis_lock.held", "lock", "import")] == 3
    assert points[("redis_lock.waiting", "lock", "import")] == 2
    assert points[("redis_lock.held", "semaphore", "renders")] == 2
    assert points[("redis_lock.waiting", "semaphore", "renders")] == 1


def test_the_census_ranks_and_caps(contended, redis_client):
    census = take_census(clock=lambda: 4e9)  # far in the future: every hold is old
    assert census.complete
    assert (census.held, census.waiting) == (6, 3)
    assert [entry.name for entry in census.most_waited()] == ["import:1", "renders"]
    assert all(entry.held_for > 1e9 for entry in census.oldest())
    assert all(0 < entry.ends_in <= 30 for entry in census.ending())
    assert census.groups(limit=1) == {  # the group with most held, and the others summed
        ("lock", "import"): GroupFigures(held=3, waiting=2),
        ("lock", "other"): GroupFigures(held=1, waiting=0),
        ("semaphore", "other"): GroupFigures(held=2, waiting=1),
    }
    # Keys that are not ours are never looked at; a cap stops the census, and says so.
    redis_client.mset({f"other:{n}": n for n in range(50)})
    assert take_census().keys_scanned == census.keys_scanned
    cut = take_census(max_keys=1)
    assert not cut.complete
    with pytest.raises(ValueError, match="max_keys"):
        take_census(max_keys=0)


def test_an_unreachable_redis_fails_the_census_not_the_scrape(settings, caplog):
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    registry = CollectorRegistry()
    CensusCollector(registry=registry)
    assert registry.get_sample_value("redis_lock_census_complete") == 0
    assert "cannot read Redis" in caplog.text


def totals_of(html: str) -> str:
    """The text of a page's held-and-waiting sentence (``totals.html``)."""
    found = re.search(r'id="lock-totals">(.*?)</span>', html, re.S)
    assert found is not None, "no totals on the page"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", found.group(1))).strip()


@pytest.mark.django_db
def test_the_hot_locks_page(contended):
    client = staff("view_heldlock")
    page = client.get(HOT)
    assert page.status_code == 200
    html = page.content.decode()
    said = (
        "Held now: 4 locks, 2 waiters queued for them; 2 permits of 1 semaphore, 1 waiter "
        "queued for them. 3 waiters in all."
    )
    assert totals_of(html) == said
    # The Locks page says the same, the semaphore's waiter too (it said "2 waiters").
    assert totals_of(client.get(CHANGELIST).content.decode()) == said
    searched = totals_of(client.get(CHANGELIST, {"q": "render"}).content.decode())
    assert searched == (
        "Held now, of the names containing “render”: no lock; 2 permits of 1 semaphore, "
        "1 waiter queued for them. 1 waiter in all."
    )
    assert '<meta http-equiv="refresh" content="5">' in html
    assert [entry.name for entry, *_ in page.context["most_waited"]] == ["import:1", "renders"]
    assert {(kind, group) for kind, group, _ in page.context["groups"]} == {
        ("lock", "import"),
        ("lock", "billing"),
        ("semaphore", "renders"),
    }
    off = client.get(HOT, {"refresh": "off"}).content.decode()
    assert 'http-equiv="refresh"' not in off
    assert "Refresh every 5 s" in off
    # The list sorts its page by waiters, and refreshes only when asked.
    listed = client.get(CHANGELIST, {"o": "waiting"})
    assert listed.context["rows"][0][0].name == "import:1"
    assert 'http-equiv="refresh"' not in listed.content.decode()
    assert (
        'http-equiv="refresh" content="5"'
        in client.get(CHANGELIST, {"refresh": 5}).content.decode()
    )
    assert staff().get(HOT).status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize("count_max_keys", [admin.COUNT_MAX_KEYS, 5])
def test_the_count_says_how_many_are_held_beyond_the_page(
    settings, redis_client, monkeypatch, count_max_keys
):
    """And, on a namespace larger than the count's census may read, "at least"."""
    settings.DJANGO_REDIS_LOCK_ADMIN_PAGE_SIZE = 10
    monkeypatch.setattr(admin, "COUNT_MAX_KEYS", count_max_keys)
    held = [Lock(f"batch:{n}") for n in range(25)]
    for each in held:
        assert each.acquire()
    try:
        html = staff("view_heldlock").get(CHANGELIST).content.decode()
    finally:
        for each in held:
            each.release()
    count = re.search(r'id="lock-count">\s*(.*?)\s*</p>', html, re.S).group(1)
    shown = int(re.search(r"Page 1 shows (\d+) of the locks", count).group(1))
    assert 10 <= shown < 25
    totals = totals_of(html)
    if count_max_keys > 25:
        assert totals == (
            "Held now: 25 locks, 0 waiters queued for them; no semaphore permit. 0 waiters in all."
        )
    else:
        at_least = int(re.match(r"Held now: (\d+) locks?", totals).group(1))
        assert at_least < 25  # the census stopped short, and the page says so
        assert re.search(r"at least: the census stopped after \d+ keys\.$", totals)


def test_redis_locks_stats(contended):
    out = io.StringIO()
    call_command("redis_locks", "stats", stdout=out)
    text = out.getvalue()
    assert text.startswith(
        "6 held (4 locks, 2 permits of 1 semaphore), 3 waiting (2 for locks, 1 for permits); "
    )
    assert re.search(r"^import\s+lock\s+3\s+2$", text, re.M)
    assert re.search(r"^renders\s+semaphore\s+2\s+1$", text, re.M)
    assert "Most waiters:" in text
    out = io.StringIO()
    call_command("redis_locks", "stats", "--json", "--watch", "0.01", "--rounds", "2", stdout=out)
    first, second = (
        json.loads(part) for part in re.split(r"(?<=\})\n(?=\{)", out.getvalue().strip())
    )
    assert first["held"] == second["held"] == 6
    assert first["most_waited"][0] == {
        "name": "import:1",
        "kind": "lock",
        "group": "import",
        "holders": 1,
        "limit": None,
        "waiting": 2,
        "held_for": first["most_waited"][0]["held_for"],
        "ends_in": first["most_waited"][0]["ends_in"],
    }
    with pytest.raises(CommandError, match="--rounds goes with --watch"):
        call_command("redis_locks", "stats", "--rounds", "2")


def test_the_guards_name_their_groups(redis_client, rf):
    seen = {}

    @lock("report:{day}")
    def report(day):
        seen["report"] = get_lock(f"report:{day}").group

    report("2026-11-24")

    @prevent_double_submit(group="checkout")
    def checkout(request):
        [info] = [info for info in take_census().entries if info.name.startswith("submit")]
        seen["view"] = info.group
        from django.http import HttpResponse

        return HttpResponse("ok")

    request = rf.post("/checkout", {"item": "1"}, REMOTE_ADDR="10.0.0.1")
    checkout(request)
    with Lock("plain:42"):
        seen["plain"] = get_lock("plain:42").group
    assert seen == {"report": "report:{day}", "view": "view:checkout", "plain": "plain"}
