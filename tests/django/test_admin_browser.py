"""The admin Locks page in a real browser: headless Chromium driven by Playwright.

Needs a Chromium binary: ``$CHROMIUM``, else ``chromium`` / ``chromium-browser`` /
``google-chrome`` on PATH (Debian/Ubuntu: ``apt install chromium``). Without one the test is
skipped. Set ``DJANGO_REDIS_LOCK_SCREENSHOT_DIR`` to keep the screenshot (the README's is made
that way).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import redis
from django.contrib.auth.models import User

from django_redis_lock import Lock, acl_rule
from django_redis_lock.task_guards import reservations
from tests.support.helpers import (
    CHROMIUM_FLAGS,
    as_user,
    django_redis_caches,
    find_chromium,
    make_acl_user,
)


@pytest.fixture
def open_locks_page(live_server, monkeypatch):
    """Headless Chromium, logged in to the admin as a superuser: call it to open the Locks
    page (it returns the Playwright page). Skips the test without Chromium or Playwright."""
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("No Chromium found: `apt install chromium`, or set CHROMIUM=/path/to/it.")
    playwright_api = pytest.importorskip("playwright.sync_api")
    User.objects.create_superuser("operator", password="operator-password")
    # Playwright's sync API runs an event loop in this thread; the ORM is not used meanwhile.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 720})

        def open_locks() -> object:
            page.goto(f"{live_server.url}/admin/login/?next=/admin/django_redis_lock/heldlock/")
            page.fill("#id_username", "operator")
            page.fill("#id_password", "operator-password")
            page.click("input[type=submit]")
            page.wait_for_selector("#result_list")
            return page

        yield open_locks
        browser.close()


# The lines an inline element's text is laid out on (one box per line, and a <wbr> may split
# one line's box in two: they share its top).
LINES = "e => new Set([...e.getClientRects()].map(r => Math.round(r.top))).size"


def keep_screenshots(*shots: Path) -> None:
    keep = os.environ.get("DJANGO_REDIS_LOCK_SCREENSHOT_DIR")
    for shot in shots if keep else ():
        shutil.copy(shot, Path(keep) / shot.name)


@pytest.mark.django_db(transaction=True)
def test_operator_releases_a_stuck_lock_in_the_browser(open_locks_page, tmp_path):
    stuck = Lock("invoices:send", timeout=300, label="send_invoices (cron, web-2)")
    assert stuck.acquire()
    others = [Lock(f"checkout:order-{n}", timeout=60, label="checkout") for n in (41, 42)]
    # A Celery task guard's: one task queued (its key kept for it), one running.
    task = "Celery task"
    queued = "5b0c6e1a-7d2f-4c8e-9a31-2f64b8d0c9e7"
    reservations.reserve("task:shop.tasks.sync_customer:42", queued, ttl=3600, label=task,
                 guard="until_executed")  # fmt: skip
    running = "c41e9f02-3b6a-4d7e-8f15-6a2d9b7e0c58"
    others.append(Lock("task:shop.tasks.sync_customer:7", timeout=60, label=task,
                       guard="until_executed", job_id=running))  # fmt: skip
    for other in others:
        other.acquire()

    page = open_locks_page()
    assert page.is_visible("text=invoices:send")
    assert page.is_visible("text=send_invoices (cron, web-2)")
    # The count sits above the list, not squeezed beside it (Django 6.0's flex container).
    count, listing = page.locator(".lock-count").bounding_box(), page.locator("#result_list")
    assert count["y"] + count["height"] <= listing.bounding_box()["y"]
    assert page.locator("#result_list tr", has_text=":42").is_visible()
    assert "queued" in page.locator("#result_list tr", has_text=":42").inner_text()
    assert "until_executed" in page.locator("#result_list tr", has_text=":7").inner_text()
    screenshot = tmp_path / "admin-locks.png"
    page.screenshot(path=str(screenshot), full_page=True)
    page.emulate_media(color_scheme="dark")  # the admin's dark theme applies to it too
    dark = tmp_path / "admin-locks-dark.png"
    page.screenshot(path=str(dark), full_page=True)
    page.emulate_media(color_scheme="light")

    page.click("#result_list >> text=invoices:send")  # its detail page
    page.wait_for_selector("#lock-detail")
    assert page.is_visible("text=send_invoices (cron, web-2)")
    assert page.is_visible("text=of a 300 s lease")
    detail = tmp_path / "admin-lock-detail.png"
    page.screenshot(path=str(detail), full_page=True)
    page.go_back()
    page.wait_for_selector("#result_list")
    page.click("#result_list >> text=task:shop.tasks.sync_customer:42")
    page.wait_for_selector("#lock-detail")
    assert page.is_visible(f"text={queued}")
    assert page.is_visible("text=one such task from queueing to the end of its run")
    task_detail = tmp_path / "admin-task-detail.png"
    page.screenshot(path=str(task_detail), full_page=True)
    page.go_back()
    page.wait_for_selector("#result_list")

    row = page.locator("#result_list tr", has_text="invoices:send")
    row.locator("a.button", has_text="Release").click()
    page.wait_for_selector("text=Yes, release")
    page.click("input[value='Yes, release']")
    page.wait_for_selector("ul.messagelist")
    assert page.is_visible("text=Released 'invoices:send'.")
    assert not page.is_visible("#result_list >> text=invoices:send")

    assert not stuck.locked()
    assert all(other.owned() for other in others)
    keep_screenshots(screenshot, dark, detail, task_detail)


@pytest.mark.django_db(transaction=True)
def test_operator_is_told_what_is_wrong_in_the_browser(
    open_locks_page, live_server, tmp_path, settings, redis_server_factory
):
    """An evicting Redis, a key that never expires, a key that is not a lock, a Redis that
    went away: each is a message on the page, never a server error."""
    import redis

    from tests.conftest import django_redis_caches

    evicting = ["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]
    server = redis_server_factory(args=evicting)
    settings.CACHES = django_redis_caches(server.url)
    client = redis.Redis.from_url(server.url)
    record = {"token": "t", "owner": '{"name": "eternal"}', "since": 1}
    client.hset("lock:{eternal}", mapping=record)
    client.set("lock:{weird}", "someone else's value")
    client.close()

    page = open_locks_page()
    assert page.is_visible("text=may evict lock keys")
    assert page.is_visible("text=never expires")
    warnings = tmp_path / "admin-warnings.png"
    page.screenshot(path=str(warnings), full_page=True)

    page.goto(f"{live_server.url}/admin/django_redis_lock/heldlock/release/?lock=t:weird")
    page.click("input[value='Yes, release']")
    page.wait_for_selector("ul.messagelist")
    assert page.is_visible("text=is not a lock")
    not_a_lock = tmp_path / "admin-not-a-lock.png"
    page.screenshot(path=str(not_a_lock), full_page=True)

    server.stop()
    page.goto(f"{live_server.url}/admin/django_redis_lock/heldlock/show/?name=eternal")
    assert page.is_visible("text=Redis could not be reached")
    redis_down = tmp_path / "admin-redis-down.png"
    page.screenshot(path=str(redis_down), full_page=True)
    keep_screenshots(warnings, not_a_lock, redis_down)


@pytest.mark.django_db(transaction=True)
def test_operator_releases_one_permit_of_a_semaphore_in_the_browser(open_locks_page, tmp_path):
    from django_redis_lock import Semaphore

    renders = [Semaphore("pdf-renders", limit=4, label=f"render invoice {n}") for n in (7, 8, 9)]
    for render in renders:
        assert render.acquire()
    partner = Semaphore("partner-api:acme", limit=2, label="sync orders")
    assert partner.acquire()
    held = Lock("invoices:send", timeout=300, label="send_invoices (cron, web-2)")
    assert held.acquire()

    page = open_locks_page()
    page.wait_for_selector("#semaphore_list")
    row = page.locator("#semaphore_list tr", has_text="pdf-renders")
    assert "3 of 4" in row.inner_text()
    listing = tmp_path / "admin-semaphores.png"
    page.screenshot(path=str(listing), full_page=True)

    row.locator("a", has_text="pdf-renders").click()
    page.wait_for_selector("#holder_list")
    assert page.is_visible("text=render invoice 8")
    detail = tmp_path / "admin-semaphore-detail.png"
    page.screenshot(path=str(detail), full_page=True)
    page.locator("#holder_list tr", has_text="render invoice 8").locator(
        "a.button", has_text="Release this permit"
    ).click()
    page.wait_for_selector("text=Yes, release")
    page.click("input[value='Yes, release']")
    page.wait_for_selector("ul.messagelist")
    assert page.is_visible("text=Released a permit of semaphore 'pdf-renders'.")
    assert "2 of 4" in page.inner_text("#semaphore-summary")

    assert [render.owned() for render in renders] == [True, False, True]
    keep_screenshots(listing, detail)
    for render in (renders[0], renders[2], partner):
        render.release()
    held.release()


@pytest.mark.django_db(transaction=True)
def test_operator_finds_the_hot_locks_in_the_browser(open_locks_page, tmp_path, redis_client):
    """The contention view: the list sorted by waiters, then the hot-locks page, which
    refreshes itself until the operator turns that off."""
    import threading

    from django_redis_lock import Semaphore
    from django_redis_lock.primitives.keys import lock_keys
    from tests.support.helpers import start_queued

    held = [Lock(f"orders:sync:{n}", timeout=120, label="sync order") for n in (11, 12)]
    held.append(Lock("invoices:send", timeout=300, label="send_invoices (cron, web-2)"))
    renders = [Semaphore("pdf-renders", limit=2, label="render invoice") for _ in range(2)]
    for primitive in held + renders:
        assert primitive.acquire()
    go = threading.Event()

    def wait_for_it(index):
        with Lock("orders:sync:11", wait=60, label=f"retry {index}"):
            go.wait(60)

    waiters = start_queued(
        3, wait_for_it, redis_client, lock_keys("orders:sync:11", "default").queue
    )
    try:
        page = open_locks_page()
        page.click("#result_list thead a:text('Waiters')")
        page.wait_for_url("**o=waiting**")
        first = page.locator("#result_list tbody tr").first
        assert "orders:sync:11" in first.inner_text()
        totals = page.inner_text("#lock-totals")
        assert totals.startswith("Held now: 3 locks, 3 waiters queued for them; 2 permits of ")
        by_waiters = tmp_path / "admin-locks-by-waiters.png"
        page.screenshot(path=str(by_waiters), full_page=True)
        page.click("text=Hot locks")
        page.wait_for_selector("#hot-waited")
        assert page.locator('meta[http-equiv="refresh"]').count() == 1
        top = page.locator("#hot-waited tbody tr").first.inner_text()
        assert "orders:sync:11" in top
        assert "\t3\t" in top
        assert page.inner_text("#lock-totals") == totals
        page.click("#hot-refresh")  # Stop refreshing
        page.wait_for_url("**refresh=off**")
        assert page.locator('meta[http-equiv="refresh"]').count() == 0
        assert page.inner_text("#hot-refresh") == "Refresh every 5 s"
        shot = tmp_path / "admin-hot-locks.png"
        page.screenshot(path=str(shot), full_page=True)
        keep_screenshots(by_waiters, shot)
    finally:
        for primitive in held + renders:
            primitive.release()
        go.set()
        for waiter in waiters:
            waiter.join(60)


@pytest.mark.django_db(transaction=True)
def test_on_a_managed_service_the_page_says_what_it_could_not_read(
    open_locks_page, tmp_path, settings, redis_server_factory
):
    """INFO refused (a managed service, or a Redis user whose ACL rule predates INFO memory's
    place in it): the locks are listed, and the page says it could not read the eviction
    policy instead of saying nothing."""
    server = redis_server_factory()
    rule = acl_rule().replace(" +info|memory", "")
    make_acl_user(redis.Redis.from_url(server.url), "locks", "locks-password", rule)
    settings.CACHES = django_redis_caches(as_user(server.url, "locks", "locks-password"))
    with Lock("reports:nightly", timeout=300, label="nightly report"):
        page = open_locks_page()
        assert page.is_visible("text=reports:nightly")
        assert page.is_visible("text=Could not read the eviction policy")
        shot = tmp_path / "admin-managed-service.png"
        page.screenshot(path=str(shot), full_page=True)
    keep_screenshots(shot)


@pytest.mark.django_db(transaction=True)
def test_a_300_character_name_keeps_the_release_button_on_the_page(open_locks_page, tmp_path):
    """A long name without a space wraps in its column (cut past 120 characters, whole in its
    title) instead of pushing the Release button off a 1280-pixel-wide page."""
    name = "exports:" + "a" * 292
    with Lock(name, timeout=300, label="a long one"), Lock("short", timeout=300):
        page = open_locks_page()
        row = page.locator("#result_list tr", has_text="a long one")
        release = row.locator("a.button", has_text="Release")
        box = release.bounding_box()
        assert box is not None
        assert box["x"] + box["width"] <= 1280  # on the page, without scrolling sideways
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        link = row.locator("th a")
        assert link.get_attribute("title") == name
        assert link.inner_text().endswith("…")
        shot = tmp_path / "admin-long-name.png"
        page.screenshot(path=str(shot), full_page=True)
    keep_screenshots(shot)


@pytest.mark.django_db(transaction=True)
def test_both_pages_count_the_same_waiters_and_keep_names_whole_at_1400_px(
    open_locks_page, tmp_path, redis_client
):
    """The demo's "Make contention": a lock with three waiters, a semaphore of two permits with
    two, and the run's own lock. The Locks page and Hot locks say the same of them (it counted
    the locks' waiters only, and said 3 where Hot locks said 5), and in a 1400-pixel-wide
    window no name is wrapped inside a word (Hot locks broke ``demo:contention`` as
    ``dem|o:con|tenti|on``)."""
    import threading

    from django_redis_lock import Semaphore
    from django_redis_lock.primitives.keys import lock_keys, permit_keys
    from tests.support.helpers import start_queued

    run = Lock("demo:contention", timeout=120, label="the demo's contention")
    report = Lock("report:nightly", timeout=120, label="nightly report")
    exports = [Semaphore("exports", limit=2, label="CSV export") for _ in range(2)]
    for primitive in (run, report, *exports):
        assert primitive.acquire()
    go = threading.Event()

    def wait_for_the_report(index):
        with Lock("report:nightly", wait=60, label="nightly report"):
            go.wait(60)

    def wait_for_an_export(index):
        with Semaphore("exports", limit=2, wait=60, label="CSV export"):
            go.wait(60)

    queues = (lock_keys("report:nightly", "default"), permit_keys("exports", "default"))
    waiters = start_queued(3, wait_for_the_report, redis_client, queues[0].queue)
    waiters += start_queued(2, wait_for_an_export, redis_client, queues[1].queue)
    try:
        page = open_locks_page()
        page.set_viewport_size({"width": 1400, "height": 900})
        page.reload()
        page.wait_for_selector("#semaphore_list")
        listed = page.inner_text("#lock-totals")
        assert "2 locks, 3 waiters queued for them" in listed
        assert "2 permits of 1 semaphore, 2 waiters queued for them" in listed
        assert "5 waiters in all" in listed
        locks_shot = tmp_path / "admin-locks-contention.png"
        page.screenshot(path=str(locks_shot), full_page=True)

        page.click("text=Hot locks")
        page.wait_for_selector("#hot-waited")
        assert page.inner_text("#lock-totals") == listed  # the same words, the same figures
        names = page.locator("#content-main th.lock-name a")
        assert names.count() >= 6  # three tables of these three
        kinds = page.locator("#content-main th.lock-name .hot-kind")
        assert kinds.count() >= 3
        for shown in [*names.all(), *kinds.all()]:
            lines = shown.evaluate(LINES)
            assert lines == 1, f"{shown.inner_text()!r} is wrapped over {lines} lines"
        assert page.evaluate("document.documentElement.scrollWidth") <= 1400
        hot_shot = tmp_path / "admin-hot-contention.png"
        page.screenshot(path=str(hot_shot), full_page=True)
        keep_screenshots(locks_shot, hot_shot)
    finally:
        for primitive in (run, report, *exports):
            primitive.release()
        go.set()
        for waiter in waiters:
            waiter.join(60)
