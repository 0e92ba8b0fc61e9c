"""The double click of docs/views.md in a real browser (headless Chromium, driven by
Playwright): a logged-in user's second click on a ``@prevent_double_submit()`` form, sent while
the first request runs, shows the page the first one redirects to, and the order is placed once.

A browser that receives two responses shows the second: before the defaults waited for the
first request, the user saw the 409 page although the order went through.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
from django.contrib.auth.models import User
from django.test import Client

from django_redis_lock.guards import double_submit
from tests.django.test_admin_browser import keep_screenshots
from tests.django.test_views import queued_for
from tests.support.helpers import CHROMIUM_FLAGS, find_chromium, wait_until
from tests.testapp import views


@pytest.fixture
def browser_page(live_server, monkeypatch):
    """A headless Chromium page, logged in as a user (with the session cookie of Django's
    test client); skips without Chromium or Playwright."""
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("No Chromium found: `apt install chromium`, or set CHROMIUM=/path/to/it.")
    playwright_api = pytest.importorskip("playwright.sync_api")
    client = Client()
    client.force_login(User.objects.create_user("alice"))
    # Playwright's sync API runs an event loop in this thread; the ORM is not used meanwhile.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        context = browser.new_context()
        context.add_cookies(
            [{"name": name, "value": cookie.value, "url": live_server.url}
             for name, cookie in client.cookies.items()]
        )  # fmt: skip
        yield context.new_page()
        browser.close()


def serving_requests() -> list[threading.Thread]:
    """The live server's threads still serving a request."""
    return [t for t in threading.enumerate() if "process_request_thread" in t.name]


def shown(page) -> str:
    """What the page shows now ('' while it navigates: there is nothing to read then)."""
    try:
        return page.content()
    except Exception:  # Playwright's Error: "the page is navigating and changing the content"
        return ""


@pytest.fixture(autouse=True)
def _fresh_views():
    views.runs.clear()
    views.gate.set()
    yield
    views.gate.set()


@pytest.mark.django_db(transaction=True)
def test_a_double_click_shows_the_first_request_s_page(
    browser_page, live_server, tmp_path, monkeypatch
):
    # The defaults' path, with the default wait widened: the 10 s a duplicate waits by default
    # is physics here, which four test workers and a browser on two cores can outlast.
    monkeypatch.setattr(double_submit, "PERSONAL_WAIT", 120.0)
    page = browser_page
    page.goto(f"{live_server.url}/checkout/form/")
    views.gate.clear()  # the first request stays in the view until the second has arrived
    box = page.locator("button").bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    with queued_for(".checkout") as queued:
        page.mouse.click(x, y)
        wait_until(lambda: views.runs["checkout"], 10, "the first request inside the view")
        # The second click of the double click, on the page the browser still shows (the
        # mouse's: a locator's click would wait for the first click's navigation). Clicked
        # again if no request came of it: a browser starved of CPU (four test workers on two
        # cores) has let a click pass now and then.
        answered = None
        for _ in range(3):
            page.mouse.click(x, y)
            with contextlib.suppress(AssertionError):
                answered = wait_until(
                    lambda: ("waiting" if queued.acquire(timeout=0.05) else None)
                    or ("refused" if "Already submitted" in shown(page) else None),
                    10, "the second request waiting for the first, or answered",
                )  # fmt: skip
            if answered is not None:
                break
        views.gate.set()
        assert answered is not None, "no click after the first reached the server"
        assert answered == "waiting", "the second click was answered 409 while the first ran"
        # (Not wait_for_url: it may follow the first click's navigation, which the second one
        # aborts, and fail with ERR_ABORTED; what the page shows in the end is the point.)
        try:
            wait_until(lambda: "placed</h1>" in shown(page), 30, "the second click's page")
        except AssertionError as error:
            raise AssertionError(
                f"{error}: at {page.url}, {shown(page)[:300]!r}; runs {dict(views.runs)}"
            ) from error
    # The first request, whose answer the browser no longer waits for, ends in a thread of the
    # live server: it must be done with the database before the test's teardown empties it
    # (the in-memory SQLite connection is shared with the server's threads).
    wait_until(lambda: not serving_requests(), 30, "the live server's requests to end")
    page.screenshot(path=tmp_path / "double-click.png")
    keep_screenshots(tmp_path / "double-click.png")
    assert page.inner_text("h1") == "Order 1 placed"
    assert "Already submitted" not in page.content()
    assert views.runs["checkout"] == 1
