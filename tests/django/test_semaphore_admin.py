"""Semaphores in the admin Locks page and in semaphore_registry: holders out of N, each
holder's record, waiters, and the force-release of one permit."""

from __future__ import annotations

import threading

import pytest
from django.contrib.admin.models import LogEntry

from django_redis_lock import LockLost, Semaphore, lock_force_released
from django_redis_lock.primitives.keys import permit_keys
from django_redis_lock.registry.semaphores import (
    force_release_permit,
    get_semaphore,
    iter_semaphores,
)
from tests.support.helpers import RENEWED_LEASE, staff, wait_until

CHANGELIST = "/admin/django_redis_lock/heldlock/"
SEMAPHORE = CHANGELIST + "semaphore/"
PERMIT = CHANGELIST + "release-permit/"


def queue_one_waiter(redis_client, name: str, limit: int) -> threading.Thread:
    """A thread that waits for a permit, then gives it back at once."""

    def take_and_give_back() -> None:
        with Semaphore(name, limit=limit, wait=10):
            pass

    waiter = threading.Thread(target=take_and_give_back)
    waiter.start()
    queue = permit_keys(name, "default").queue
    wait_until(lambda: redis_client.llen(queue) == 1, 10, "the waiter in line")
    return waiter


def test_registry_reads_holders_waiters_and_limit(redis_client):
    first = Semaphore("renders", limit=2, label="render A")
    second = Semaphore("renders", limit=2, label="render B")
    assert first.acquire()
    assert second.acquire()
    waiter = queue_one_waiter(redis_client, "renders", 2)
    info = get_semaphore("renders")
    assert info is not None
    assert (info.name, info.limit, info.waiting) == ("renders", 2, 1)
    assert {holder.label for holder in info.holders} == {"render A", "render B"}
    assert {holder.token for holder in info.holders} == {first.token, second.token}
    assert all(0 < holder.ttl <= 30 for holder in info.holders)
    assert info.as_dict()["holders"][0]["label"] in {"render A", "render B"}
    assert [found.name for found in iter_semaphores()] == ["renders"]
    assert list(iter_semaphores(match="nothing")) == []
    first.release()
    waiter.join(10)
    second.release()
    assert get_semaphore("renders") is None


def test_hashed_and_tagged_names_are_listed_by_name():
    names = ["a name with spaces", "jobs:{tenant-1}:imports"]
    semaphores = [Semaphore(name, limit=1) for name in names]
    for semaphore in semaphores:
        assert semaphore.acquire()
    assert sorted(info.name for info in iter_semaphores()) == sorted(names)
    for semaphore in semaphores:
        semaphore.release()


def test_force_release_of_one_permit_hands_it_to_the_first_waiter(redis_client, settings):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = RENEWED_LEASE  # (held until force-released)
    stuck = Semaphore("imports", limit=1)
    assert stuck.acquire()
    released = []
    lock_force_released.connect(receiver := lambda sender, **kw: released.append((sender, kw)))
    try:
        got = []

        def wait_for_a_permit() -> None:
            semaphore = Semaphore("imports", limit=1, wait=10)
            got.append(semaphore.acquire())
            semaphore.release()

        waiter = threading.Thread(target=wait_for_a_permit)
        waiter.start()
        wait_until(
            lambda: redis_client.llen(permit_keys("imports", "default").queue), 10, "queued"
        )
        assert force_release_permit("imports", "not-a-token") is False  # nothing freed
        assert force_release_permit("imports", stuck.token, by="ops")
        waiter.join(10)
        assert got == [True]
        wait_until(lambda: stuck.lost, 10, "the holder's renewal to notice")
        with pytest.raises(LockLost):
            stuck.ensure_held()
    finally:
        lock_force_released.disconnect(receiver)
    [(sender, kwargs)] = released
    assert sender is Semaphore
    assert kwargs["by"] == "ops"
    assert kwargs["owner"]["token"] == stuck.token


@pytest.mark.django_db
def test_admin_lists_semaphores_and_shows_their_holders(redis_client):
    viewer = staff("view_heldlock")
    holders = [Semaphore("pdf-renders", limit=3, label="render") for _ in range(2)]
    for semaphore in holders:
        assert semaphore.acquire()
    listing = viewer.get(CHANGELIST).content.decode()
    assert 'id="semaphore_list"' in listing
    assert "2 of 3" in listing
    detail = viewer.get(SEMAPHORE, {"name": "pdf-renders"}).content.decode()
    assert "2 of 3</strong>" in detail
    assert "nobody waiting" in detail
    assert detail.count("render") >= 2
    assert "Release this permit" not in detail  # a viewer cannot release
    assert viewer.get(PERMIT, {"permit": f"{holders[0].token}:pdf-renders"}).status_code == 403
    missing = viewer.get(SEMAPHORE, {"name": "none"}).content.decode()
    assert "No permit of a semaphore named" in missing
    for semaphore in holders:
        semaphore.release()


@pytest.mark.django_db
def test_admin_force_releases_one_permit_after_confirmation(redis_client):
    releaser = staff("view_heldlock", "release_lock")
    first, second = Semaphore("exports", limit=2), Semaphore("exports", limit=2)
    assert first.acquire()
    assert second.acquire()
    detail = releaser.get(SEMAPHORE, {"name": "exports"}).content.decode()
    assert detail.count("Release this permit") == 2
    confirm = releaser.get(PERMIT, {"permit": f"{first.token}:exports"})
    assert "Yes, release" in confirm.content.decode()
    assert first.owned()  # showing the confirmation changed nothing
    done = releaser.post(PERMIT, {"permit": f"{first.token}:exports", "confirm": "yes"})
    assert done.status_code == 302
    assert not first.owned()
    assert second.owned()  # the other permit is left alone
    entry = LogEntry.objects.get()
    assert first.token in entry.change_message
    again = releaser.post(PERMIT, {"permit": f"{first.token}:exports", "confirm": "yes"})
    assert again.status_code == 302  # told, in a message, that nothing was freed
    assert second.owned()
    second.release()


@pytest.mark.django_db
def test_admin_permit_links_name_the_permit_and_a_malformed_one_is_an_error(redis_client):
    """The holder's button names its permit as the lock list names a lease (the token
    percent-encoded, then the name, which may have colons); a value the page did not write is
    an error message naming it, not "No permit was selected"."""
    import html
    import re
    from urllib.parse import unquote

    releaser = staff("view_heldlock", "release_lock")
    held = Semaphore("partner-api:acme:orders", limit=2)
    assert held.acquire()
    detail = releaser.get(SEMAPHORE, {"name": "partner-api:acme:orders"}).content.decode()
    [link] = re.findall(r'href="[^"]*/release-permit/\?permit=([^"]+)"', detail)
    permit = unquote(html.unescape(link))
    confirm = releaser.get(PERMIT, {"permit": permit}).content.decode()
    assert "held by" in confirm
    [hidden] = re.findall(r'name="permit" value="([^"]+)"', confirm)
    assert html.unescape(hidden) == permit
    for bad in ("no-colon-here", ":partner-api:acme:orders", "100%:partner-api:acme:orders"):
        response = releaser.post(PERMIT, {"permit": bad, "confirm": "yes"}, follow=True)
        text = response.content.decode()
        assert f"{html.escape(repr(bad))} does not name a permit" in text
        assert "No permit was selected" not in text
    assert held.owned()
    releaser.post(PERMIT, {"permit": permit, "confirm": "yes"})
    assert not held.owned()


# -- manage.py redis_locks semaphores / release-permit ----------------------------------------


def test_cli_lists_shows_and_releases_one_permit():
    import io
    import json

    from django.core.management import CommandError, call_command

    first = Semaphore("cli:renders", limit=3, label="render")
    second = Semaphore("cli:renders", limit=3, label="render")
    assert first.acquire()
    assert second.acquire()
    out = io.StringIO()
    call_command("redis_locks", "semaphores", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["NAME", "HELD", "WAITING", "LABELS"]
    assert lines[1].split() == ["cli:renders", "2/3", "0", "render"]
    out = io.StringIO()
    call_command("redis_locks", "semaphores", "cli:renders", "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["limit"] == 3
    assert {holder["token"] for holder in shown["holders"]} == {first.token, second.token}
    out = io.StringIO()
    call_command("redis_locks", "release-permit", "cli:renders", first.token, stdout=out)
    assert "Released a permit of 'cli:renders'" in out.getvalue()
    assert not first.owned()
    assert second.owned()
    with pytest.raises(CommandError, match="Nothing was freed"):
        call_command("redis_locks", "release-permit", "cli:renders", first.token)
    with pytest.raises(CommandError, match="No permit of a semaphore named"):
        call_command("redis_locks", "semaphores", "cli:none")
    second.release()
    err = io.StringIO()
    call_command("redis_locks", "semaphores", stdout=io.StringIO(), stderr=err)
    assert "No semaphore has a permit held." in err.getvalue()
