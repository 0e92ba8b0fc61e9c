"""The admin Locks page: permissions, listing, search, detail, force-release."""

from __future__ import annotations

import html
import os
import re
import threading
from urllib.parse import unquote

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.test import Client

from django_redis_lock import Lock, LockNotOwned
from django_redis_lock.registry import locks as lock_registry
from tests.support.helpers import staff, wait_until

CHANGELIST = "/admin/django_redis_lock/heldlock/"
RELEASE = CHANGELIST + "release/"
DETAIL = CHANGELIST + "show/"

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer():
    return staff("view_heldlock")


@pytest.fixture
def releaser():
    return staff("view_heldlock", "release_lock")


def test_anonymous_goes_to_login():
    response = Client().get(CHANGELIST)
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_staff_without_permission_gets_403():
    assert staff().get(CHANGELIST).status_code == 403


def test_locks_entry_on_the_admin_index(viewer):
    index = viewer.get("/admin/").content.decode()
    assert "Redis locks" in index
    assert CHANGELIST in index


def test_viewer_sees_held_locks_without_release_buttons(viewer):
    with Lock("reports:nightly", timeout=30, label="nightly report"):
        page = viewer.get(CHANGELIST).content.decode()
    assert "reports:nightly" in page
    assert "nightly report" in page
    assert "Release" not in page


def test_empty_state(viewer):
    page = viewer.get(CHANGELIST).content.decode()
    assert "No locks are held right now." in page


def test_search_and_next_page(viewer, settings):
    settings.DJANGO_REDIS_LOCK_ADMIN_PAGE_SIZE = 5
    locks = [Lock(f"job:{i}", timeout=30) for i in range(12)] + [Lock("other", timeout=30)]
    for lock in locks:
        lock.acquire()
    seen, url = [], CHANGELIST + "?q=job:"
    for _ in range(10):
        response = viewer.get(url)
        page = response.content.decode().replace("<wbr>", "")  # a name's break opportunities
        seen += [f"job:{i}" for i in range(12) if f">job:{i}<" in page]
        assert ">other<" not in page
        if "Next page" not in page:
            break
        url = CHANGELIST + page.split('class="showall" href="')[1].split('"')[0].replace(
            "&amp;", "&"
        )
    assert sorted(seen) == sorted(f"job:{i}" for i in range(12))


def test_label_is_escaped(viewer):
    with Lock("xss", timeout=30, label="<script>alert(1)</script>"):
        page = viewer.get(CHANGELIST).content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_detail_is_readable(viewer):
    """Who holds it, since when, when the lease ends, who waits, the fence and the keys, each
    said in words (not the record's field names)."""
    held = Lock("detailed", timeout=30, label="why", fencing=True)
    held.acquire()
    fence = held.fencing_token
    waiter = Lock("detailed", wait=5)
    waiting = threading.Thread(target=lambda: waiter.acquire() and waiter.release())
    waiting.start()
    try:
        wait_until(lambda: lock_registry.waiting("detailed") == 1, timeout=10)
        page = viewer.get(DETAIL, {"name": "detailed"}).content.decode()
    finally:
        held.release()
        waiting.join(10)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)).replace(" ,", ",")
    assert "Label why" in text
    assert f"process {os.getpid()}, thread MainThread" in text
    assert re.search(r"Lease ends in \d+\.\d s, of a 30 s lease", text)
    assert "Waiting for it 1 in line" in text
    assert f"Fencing token {fence}" in text
    assert "(the lease)" in text
    assert "(the queue)" in text


def test_the_list_is_in_a_stable_order(viewer):
    names = ["m:b", "m:c", "m:a", "m:e", "m:d"]
    locks = [Lock(name, timeout=30) for name in names]
    for held in locks:
        held.acquire()
    try:
        pages = {tuple(re.findall(r">(m:<wbr>[a-e])<", viewer.get(CHANGELIST).content.decode()))
                 for _ in range(3)}  # fmt: skip
    finally:
        for held in locks:
            held.release()
    assert pages == {tuple(name.replace(":", ":<wbr>") for name in sorted(names))}


def test_release_needs_the_permission(viewer):
    with Lock("guarded", timeout=30) as held:
        response = viewer.post(RELEASE, {"lock": f"{held.token}:guarded", "confirm": "yes"})
        assert response.status_code == 403
        assert held.owned()


def test_release_through_the_confirmation_page(releaser):
    holder = Lock("stuck", timeout=30, label="stuck job")
    holder.acquire()
    listing = releaser.get(CHANGELIST).content.decode()
    assert "Release…" in listing
    confirm = releaser.get(RELEASE, {"lock": f"{holder.token}:stuck"})
    assert confirm.status_code == 200
    assert "Yes, release" in confirm.content.decode()
    assert holder.owned()  # showing the confirmation changed nothing
    done = releaser.post(RELEASE, {"lock": f"{holder.token}:stuck", "confirm": "yes"})
    assert done.status_code == 302
    assert not holder.locked()
    entry = LogEntry.objects.get()
    assert entry.object_repr == "stuck"
    assert holder.token in entry.change_message


def test_bulk_release(releaser):
    locks = [Lock(f"bulk:{i}", timeout=30) for i in range(3)]
    for lock in locks:
        lock.acquire()
    values = [f"{lock.token}:{lock.name}" for lock in locks[:2]]
    releaser.post(RELEASE, {"lock": values, "confirm": "yes"})
    assert [lock.locked() for lock in locks] == [False, False, True]


def test_release_of_a_lock_that_changed_hands_deletes_nothing(releaser):
    first = Lock("handed", timeout=30)
    first.acquire()
    shown_token = first.token
    first.release()
    second = Lock("handed", timeout=30)
    second.acquire()
    response = releaser.post(
        RELEASE, {"lock": f"{shown_token}:handed", "confirm": "yes"}, follow=True
    )
    assert "Nothing was deleted" in response.content.decode()
    assert second.owned()
    assert not LogEntry.objects.exists()


def _links_and_boxes(page: str) -> tuple[list[str], list[str]]:
    """The Release… links' query values, and the checkboxes' values, of a rendered list."""
    links = re.findall(r'href="[^"]*/release/\?lock=([^"]+)"', page)
    boxes = re.findall(r'name="lock" value="([^"]+)"', page)
    return [unquote(html.unescape(link)) for link in links], list(map(html.unescape, boxes))


def test_a_job_id_with_colons_is_released_from_its_button_and_its_checkbox(releaser):
    """A job's reservation carries the job's id in its token (``rq:job:42~queued``), and lock
    names have colons too: what the page shows names the lease whichever way it is split, and
    releasing it frees it (a split at the first colon found no lock, and said nothing useful)."""
    from django_redis_lock.task_guards import reservations

    one, two = "task:shop.tasks.sync:42", "task:shop.tasks.sync:43"
    assert reservations.reserve(one, "rq:job:42", ttl=600, label="RQ job").reserved
    assert reservations.reserve(two, "celery:a%3Ab:c", ttl=600, label="odd id").reserved
    links, boxes = _links_and_boxes(releaser.get(CHANGELIST).content.decode())
    assert len(links) == 2
    assert sorted(links) == sorted(boxes)
    [link] = [value for value in links if value.endswith(":42")]
    confirm = releaser.get(RELEASE, {"lock": link}).content.decode()
    assert "held by" in confirm  # the lease it names was found, with the token shown
    assert "no longer held" not in confirm
    confirmed = [html.unescape(v) for v in re.findall(r'name="lock" value="([^"]+)"', confirm)]
    assert confirmed == [link]
    done = releaser.post(RELEASE, {"lock": confirmed, "confirm": "yes"}, follow=True)
    assert f"Released {html.escape(repr(one))}." in done.content.decode()
    assert lock_registry.get_lock(one) is None
    assert "rq:job:42~queued" in LogEntry.objects.get().change_message
    [box] = [value for value in boxes if value.endswith(":43")]
    releaser.post(RELEASE, {"lock": [box], "confirm": "yes"})
    assert lock_registry.get_lock(two) is None


def test_a_value_that_names_no_lease_is_an_error_message(releaser):
    """A value the page did not write (no colon, no token, a token not as the page encodes it)
    is named in an error, while the well-formed ones of the same request go on."""
    with Lock("kept", timeout=30) as held:
        bad = ["no-colon-here", ":kept", "100%:kept"]  # no token; one not percent-encoded
        confirm = releaser.get(RELEASE, {"lock": [*bad, f"{held.token}:kept"]}).content.decode()
        for value in bad:
            assert f"{html.escape(repr(value))} does not name a lock" in confirm
        assert "held by" in confirm  # the good one is still offered
        alone = releaser.post(RELEASE, {"lock": bad[:1], "confirm": "yes"}, follow=True)
        text = alone.content.decode()
        assert "does not name a lock" in text
        assert "No lock was selected" not in text
        assert held.owned()
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    ("token", "name"),
    [("AbC-123_xyz", "plain"), ("rq:job:42~queued", "demo:contention"),
     ("celery:a%3Ab~r4nd", "100%:x"), ("été:~", ":")],
)  # fmt: skip
def test_a_lease_reference_gives_back_its_token_and_name(token, name):
    from django_redis_lock.admin_display import lease_from_reference, lease_reference

    assert lease_from_reference(lease_reference(token, name)) == (token, name)


@pytest.mark.parametrize("value", ["", "no-colon", ":name", "token:", "100%:x", "rq%3ajob:x"])
def test_a_value_no_lease_reference_has_is_refused(value):
    from django_redis_lock.admin_display import lease_from_reference

    with pytest.raises(ValueError, match="not a lease reference"):
        lease_from_reference(value)


def test_a_name_is_shown_escaped_and_breaks_between_its_parts():
    from django_redis_lock.admin_display import breakable

    shown = breakable("<i>&x:shop.tasks/sync")
    assert shown == "&lt;i&gt;&amp;x:<wbr>shop.<wbr>tasks/<wbr>sync"
    assert breakable("demo:contention") == "demo:<wbr>contention"
    assert breakable("a" * 300) == "a" * 119 + "…"


def test_csrf_is_enforced():
    user = User.objects.create_superuser("admin", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    with Lock("csrf", timeout=30) as held:
        response = client.post(RELEASE, {"lock": f"{held.token}:csrf", "confirm": "yes"})
        assert response.status_code == 403
        assert held.owned()


def test_superuser_can_release():
    user = User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(user)
    held = Lock("root-release", timeout=30)
    held.acquire()
    client.post(RELEASE, {"lock": f"{held.token}:root-release", "confirm": "yes"})
    assert not held.locked()
    with pytest.raises(LockNotOwned):  # the former holder finds out
        held.release()


def test_rendering_the_page_never_sends_keys(viewer, redis_client):
    for index in range(30):
        Lock(f"keys-check:{index}", timeout=30).acquire()

    def keys_calls():
        return redis_client.info("commandstats").get("cmdstat_keys", {}).get("calls", 0)

    before = keys_calls()
    assert viewer.get(CHANGELIST).status_code == 200
    assert viewer.get(CHANGELIST, {"q": "keys-check:1"}).status_code == 200
    assert viewer.get(DETAIL, {"name": "keys-check:1"}).status_code == 200
    assert keys_calls() == before
    assert redis_client.info("commandstats")["cmdstat_scan"]["calls"] > 0


def test_the_page_says_how_many_are_held_and_what_the_page_shows(viewer):
    with Lock("counted", timeout=30):
        page = viewer.get(CHANGELIST).content.decode()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))
    assert (
        "Held now: 1 lock, 0 waiters queued for it; no semaphore permit. 0 waiters in all. "
        "Page 1 shows 1 of the locks, by name" in text
    )


# -- errors are messages, never a 500, and nothing is deleted ---------------------------------


@pytest.fixture
def redis_down(settings):
    from tests.conftest import django_redis_caches

    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")  # nothing listens there


def test_detail_page_says_redis_is_down(releaser, redis_down):
    response = releaser.get(DETAIL, {"name": "anything"})
    assert response.status_code == 200
    assert "Redis could not be reached" in response.content.decode()


def test_release_confirmation_page_says_redis_is_down(releaser, redis_down):
    response = releaser.get(RELEASE, {"lock": "some-token:anything"})
    assert response.status_code == 200
    assert "Redis could not be reached" in response.content.decode()


def test_confirmed_release_says_redis_is_down(releaser, redis_down):
    response = releaser.post(
        RELEASE, {"lock": "some-token:anything", "confirm": "yes"}, follow=True
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "was not released" in page
    assert "Redis could not be reached" in page
    assert not LogEntry.objects.exists()


def test_releasing_a_key_that_is_not_a_lock_deletes_nothing(releaser, redis_client, planted):
    redis_client.set("lock:{weird}", "x")  # someone else's key, in our namespace
    planted.add("lock:{weird}")
    confirm = releaser.get(RELEASE, {"lock": "some-token:weird"})
    assert confirm.status_code == 200
    response = releaser.post(RELEASE, {"lock": "some-token:weird", "confirm": "yes"}, follow=True)
    assert response.status_code == 200
    assert "is not a lock" in response.content.decode()
    assert redis_client.get("lock:{weird}") == b"x"
    assert not LogEntry.objects.exists()


def test_a_key_without_expiry_is_shown_as_such(viewer, redis_client, planted):
    key = "lock:{eternal}"
    redis_client.hset(key, mapping={"token": "t", "owner": '{"name": "eternal"}', "since": 1})
    planted.add(key)
    assert "never expires" in viewer.get(CHANGELIST).content.decode()
    assert "never expires" in viewer.get(DETAIL, {"name": "eternal"}).content.decode()


def test_an_evicting_redis_is_named_above_the_list(viewer, settings, redis_server_factory):
    from tests.conftest import django_redis_caches

    server = redis_server_factory(
        args=["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]
    )
    settings.CACHES = django_redis_caches(server.url)
    page = viewer.get(CHANGELIST).content.decode()
    assert "may evict lock keys" in page
    assert "allkeys-lru" in page


def test_task_guards_locks_show_their_task_and_guard(viewer):
    from django_redis_lock.task_guards import reservations

    queued_id, running_id = "4f1c2b9e-queued", "8a0d7c3f-running"
    assert reservations.reserve(
        "task:shop.tasks.sync_customer:42", queued_id, ttl=600,
        label="Celery task", guard="until_executed",
    ).reserved  # fmt: skip
    run = Lock("task:shop.tasks.sync_customer:43", timeout=30, job_id=running_id,
               guard="until_executed", label="Celery task")  # fmt: skip
    with run:
        page = viewer.get(CHANGELIST).content.decode()
        assert f'title="{queued_id}"' in page
        assert "queued by " in page
        assert "until_executed" in page
        assert re.search(r"running</span>\s*<br>", page)
        detail = viewer.get(DETAIL, {"name": "task:shop.tasks.sync_customer:42"})
        text = detail.content.decode()
        assert f"<code>{queued_id}</code>" in text
        assert "<strong>queued</strong>" in text
        assert "Queued by" in text
        assert "one such task from queueing to the end of its run" in text
        running = viewer.get(DETAIL, {"name": "task:shop.tasks.sync_customer:43"})
        assert "<strong>running</strong>" in running.content.decode()
