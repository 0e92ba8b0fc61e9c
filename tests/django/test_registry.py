"""Listing live locks with SCAN, force-release, and the redis_locks command."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redis_lock import Lock, LockLost, lock_force_released, registry
from django_redis_lock.backends.wire import execute_many
from django_redis_lock.core import flows
from django_redis_lock.primitives.keys import lock_keys
from tests.conftest import django_redis_caches
from tests.support.helpers import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]


def hold_many(client, count, prefix="bulk"):
    """``count`` live locks, written as the engine writes them, in a few round trips."""
    names = [f"{prefix}:{index}" for index in range(count)]
    for start in range(0, count, 200):
        locks = [Lock(name, timeout=60) for name in names[start : start + 200]]
        for lock in locks:
            assert lock.acquire(wait=0)
    return names


def test_every_lock_appears_exactly_once_across_pages(redis_client, planted):
    names = hold_many(redis_client, 1050)
    redis_client.set("lock:{bulk:0}:q", "a sibling key, not a lock")
    planted.add("lock:{bulk:0}:q")
    seen, cursor, pages = [], "0", 0
    while cursor is not None:
        items, cursor = registry.page(cursor, 100)
        seen.extend(info.name for info in items)
        pages += 1
    assert sorted(seen) == sorted(names)
    assert pages >= 10


def test_keys_is_never_sent(redis_client):
    hold_many(redis_client, 50)
    before = redis_client.info("commandstats").get("cmdstat_keys", {}).get("calls", 0)
    list(registry.iter_locks())
    list(registry.iter_locks(match="bulk:1"))
    call_command("redis_locks", "list", stdout=io.StringIO())
    after = redis_client.info("commandstats").get("cmdstat_keys", {}).get("calls", 0)
    assert after == before


def test_lock_info_fields(redis_client):
    with Lock("report", timeout=30, label="nightly", fencing=True) as held:
        [info] = list(registry.iter_locks())
        assert info.name == "report"
        assert info.label == "nightly"
        assert info.pid
        assert info.host
        assert info.thread
        assert info.acquired_at is not None
        assert 29 < info.ttl <= 30
        assert info.lease == 30
        assert info.fencing_token == held.fencing_token
        assert info.token == held.token
        assert info.valid


@pytest.mark.parametrize(
    "names",
    [
        ["a*b", "axb", "a*bc", "zz"],
        ["x?y", "xzy", "[x]", "x", "back\\slash", "back"],
        ["plain:1", "plain:12", "other"],
        ["über lock", "über", "uber"],
    ],
)
def test_search_matches_literally(redis_client, names):
    for name in names:
        assert Lock(name, timeout=30).acquire(wait=0)
    for query in names:
        found = sorted(info.name for info in registry.iter_locks(match=query))
        assert found == sorted(name for name in names if query in name), query


def test_a_key_without_a_valid_record_is_shown_not_a_crash(redis_client):
    redis_client.hset("lock:{broken}", mapping={"token": "t", "owner": "not json"})
    redis_client.pexpire("lock:{broken}", 10_000)
    redis_client.set("lock:{strange}", "not a hash", px=10_000)
    infos = {info.key: info for info in registry.iter_locks()}
    assert not infos["lock:{broken}"].valid
    assert not infos["lock:{strange}"].valid


def test_force_release_only_deletes_the_lease_that_was_shown(redis_client):
    first = Lock("handed", timeout=30)
    first.acquire()
    shown = registry.get_lock("handed")
    redis_client.pexpire(lock_keys("handed", "default").lease, 1)  # its lease ends now
    second = Lock("handed", timeout=30)
    assert second.acquire(wait=5)  # the first lease ended and the lock changed hands
    assert registry.force_release("handed", shown.token) is False
    assert second.owned()
    assert registry.force_release("handed", second.token) is True
    assert not second.locked()


def test_a_name_with_a_lone_surrogate_is_listed_and_released_by_that_name(redis_client):
    """Python str may hold a lone surrogate (from surrogateescape'd file names, say): the key is
    made of it with surrogatepass, and the record must be read back the same way."""
    name = "a\ud800b"
    lock = Lock(name, timeout=30, label="odd")
    assert lock.acquire(wait=0)
    [listed] = [info for info in registry.iter_locks() if info.label == "odd"]
    assert listed.name == name
    assert registry.get_lock(name).name == name
    assert registry.force_release(listed.name, listed.token) is True
    assert not lock.locked()


def test_force_release_is_reported_to_the_former_holder_and_wakes_a_waiter(
    redis_client, settings, monkeypatch
):
    # The waiter's blocks last a minute (the holder's lease, its wait and BLOCK_CAP all
    # longer): only a wake-up ends one sooner.
    monkeypatch.setattr(flows, "BLOCK_CAP", 60.0)
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 60
    released = []
    lock_force_released.connect(
        lambda **kwargs: released.append(kwargs), weak=False, dispatch_uid="force"
    )
    got_it = threading.Event()
    waiter = threading.Thread(
        target=lambda: Lock("stuck", wait=120, timeout=5).acquire() and got_it.set()
    )
    try:
        with pytest.raises(LockLost), Lock("stuck", label="stuck job") as held:
            waiter.start()
            wait_until(
                lambda: redis_client.exists(lock_keys("stuck", "default").queue), 10, "queued"
            )
            assert registry.force_release("stuck", held.token, by="an operator")
            # Woken by the release, not by a look a minute on (nor a lease running out).
            assert got_it.wait(30)
    finally:
        lock_force_released.disconnect(dispatch_uid="force")
        waiter.join()
    assert released[0]["name"] == "stuck"
    assert released[0]["by"] == "an operator"
    assert released[0]["owner"]["label"] == "stuck job"


def test_page_rejects_bad_arguments():
    with pytest.raises(ValueError, match="page_size"):
        registry.page("0", 0)
    with pytest.raises(ValueError, match="cursor"):
        registry.page("x:y")


def test_glob_escape():
    assert registry.glob_escape("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"


def test_pipelined_reads_handle_resp_shapes(redis_client):
    # One round trip for a batch of records and TTLs, errors in place.
    redis_client.set("plain", "x")
    replies = execute_many(redis_client, [("HGETALL", "plain"), ("PTTL", "plain")])
    assert isinstance(replies[0], Exception)
    assert replies[1] == -1


# -- manage.py redis_locks -------------------------------------------------------------------


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command("redis_locks", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_cli_list_table_and_json():
    with Lock("cli:a", timeout=30, label="first"), Lock("cli:b", timeout=30):
        out, _ = run("list")
        header = out.splitlines()[0].split()
        assert header == ["NAME", "LABEL", "HOLDER", "TASK", "WAITING", "AGE", "TTL", "FENCE"]
        assert "cli:a" in out
        assert "first" in out
        out, _ = run("list", "--json", "--match", "cli:a")
        [record] = json.loads(out)
        assert record["name"] == "cli:a"
        assert set(record) == {
            "name", "label", "host", "pid", "thread", "task", "acquired_at", "ttl", "lease",
            "fencing_token", "token", "job_id", "queued", "guard", "group", "waiting", "key",
            "valid",
        }  # fmt: skip
        assert (record["group"], record["waiting"]) == ("cli:a", 0)
        out, _ = run("list", "--json", "--limit", "1")
        assert len(json.loads(out)) == 1


def test_cli_list_when_empty():
    _out, err = run("list")
    assert "No locks are held." in err


def test_cli_show():
    with Lock("cli:show", timeout=30, label="why"):
        out, _ = run("show", "cli:show", "--json")
        assert json.loads(out)["label"] == "why"
        out, _ = run("show", "cli:show")
        assert "label" in out
    with pytest.raises(CommandError, match="No lock named"):
        run("show", "cli:show")


def test_cli_release_with_token_and_yes():
    holder = Lock("cli:release", timeout=30)
    holder.acquire()
    with pytest.raises(CommandError, match="Nothing was deleted"):
        run("release", "cli:release", "--token", "0" * 32)
    assert holder.owned()
    with pytest.raises(CommandError, match="--yes"):
        run("release", "cli:release")  # no terminal to confirm on
    assert holder.owned()
    out, _ = run("release", "cli:release", "--yes")
    assert "Released" in out
    assert not holder.locked()


def test_cli_with_redis_down_says_so_in_one_line(settings, redis_url):
    """Not redis-py's traceback: one line naming the problem, and exit status 3."""
    settings.CACHES = django_redis_caches(f"redis://127.0.0.1:{free_port()}/0")
    for args in (("list",), ("show", "anything"), ("release", "anything", "--yes")):
        with pytest.raises(CommandError, match=r"^Redis could not be reached: ") as caught:
            run(*args)
        assert caught.value.returncode == 3
        assert "\n" not in str(caught.value)


def test_the_cli_with_redis_down_from_the_command_line(redis_url):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    env["DJANGO_REDIS_LOCK_TEST_REDIS_URL"] = dead
    done = subprocess.run(
        [sys.executable, "-m", "django", "redis_locks", "list"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 3
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("CommandError: Redis could not be reached: ")
