"""A holder that died on this machine passes its lock on at once (the watch for dead holders);
a holder elsewhere, or in another PID namespace, never has its lease cut short."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from django_redis_lock import Lock
from django_redis_lock.backends import backend_of
from django_redis_lock.core.dead_holders import ProcessRecord, dead, process_of
from django_redis_lock.core.lease import reservation_token
from django_redis_lock.primitives import owners
from django_redis_lock.primitives.background import process_records
from django_redis_lock.primitives.background.dead_holders import dead_holder_watch
from django_redis_lock.primitives.keys import lock_keys, process_key
from tests.support import workers
from tests.support.helpers import start_queued, wait_until
from tests.support.proxy import HOLD_REPLIES

SPAWN = multiprocessing.get_context("spawn")
HERE = process_records.here()

needs_proc = pytest.mark.skipif(HERE is None, reason="no /proc to look processes up in")


# -- the rules ------------------------------------------------------------------------------------


def test_a_token_starts_with_its_process_id_and_a_reservation_has_none():
    token = owners.new_token()
    assert len(token) == 16
    assert process_of(token) == owners.process_id
    assert process_of(owners.job_token("job-1")) == owners.process_id
    assert process_of(reservation_token("job-1")) is None
    assert process_of("an-older-versions-token-of-22") is None


def test_only_a_process_in_the_same_place_whose_pid_is_gone_or_reused_is_dead():
    record = ProcessRecord("boot/4:1", 4242, "1000")
    assert dead(record, "boot/4:1", None)  # gone (or a zombie)
    assert dead(record, "boot/4:1", "2000")  # the pid is another process's now
    assert not dead(record, "boot/4:1", "1000")  # alive
    assert not dead(record, "boot/4:2", None)  # another PID namespace: cannot tell from here
    assert not dead(record, "other-boot/4:1", None)  # another machine (or boot)
    assert not dead(record, None, None)  # nowhere to look
    assert ProcessRecord.decode(record.encode().encode()) == record
    assert ProcessRecord.decode(b"not|a record") is None
    assert ProcessRecord.decode(None) is None


@needs_proc
def test_the_start_time_tells_a_live_process_from_a_gone_one():
    assert process_records.started(os.getpid()) is not None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: no such pid any more
    assert process_records.started(child.pid) is None


# -- with real processes ------------------------------------------------------------------------


@needs_proc
def test_a_killed_holder_on_this_machine_passes_the_lock_on_at_once(redis_url, redis_client):
    """The holder has the default lease (30 s, renewed): the waiter, allowed 20 s, can only get
    the lock through the holder's death being seen."""
    _killed_holder_passes_the_lock_on(redis_url, redis_client, "killed-holder")


@needs_proc
def test_a_killed_holder_of_a_group_passes_each_lock_on_at_once(redis_url, redis_client):
    """``lock_many`` takes its members in one script, without their own ``claim()``: it writes
    the process's record first all the same (found by the runtime simulation: a group taken
    so was never judged dead, and its locks waited out their leases)."""
    names = ["group-a", "group-b"]
    ready = SPAWN.Event()
    holder = SPAWN.Process(target=workers.hold_group_until_killed, args=(redis_url, names, ready))
    holder.start()
    try:
        assert ready.wait(60)
        owner = process_of(_token(redis_client, lock_keys(names[0], "default")))
        assert redis_client.exists(process_key("default", owner or ""))  # its record
        os.kill(holder.pid, signal.SIGKILL)
        for name in names:  # (leases of 30 s, renewed: only its death frees them)
            lock = Lock(name)
            assert lock.acquire(wait=20)
            lock.release()
    finally:
        holder.kill()
        holder.join(10)


@needs_proc
def test_a_server_that_stops_answering_holds_up_no_other_servers_deaths(
    redis_url, redis_client, redis_proxy, settings
):
    """The watch is one thread for every server of the process. Busy reading a holder's
    record on a server that stopped answering (paused: its connections stay open; without a
    SOCKET_TIMEOUT, redis-py before 6 waits on them for good), it still sees a holder die on
    another server: it gives up on the silent one after its own reply timeout. (A connection
    made anew to a silent server waits for its handshake's reply as long as SOCKET_TIMEOUT
    says: docs/deployment.md, "Timeouts".)"""
    settings.CACHES = {
        **settings.CACHES,
        "silent": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_proxy.url},
    }
    assert backend_of("silent").send_request("PING")  # (its connection made: then it is paused)
    redis_proxy.mode = HOLD_REPLIES
    stranger = secrets.token_hex(8)  # (the token of a process this one never saw)
    dead_holder_watch.seen("silent", lock_keys("elsewhere", "silent"), f"{stranger}|x".encode())
    assert redis_proxy.held.wait(10)  # the watch asked for its record: no answer comes
    try:
        _killed_holder_passes_the_lock_on(redis_url, redis_client, "killed-beside-silent")
    finally:
        redis_proxy.let_go()


def _killed_holder_passes_the_lock_on(redis_url, redis_client, name: str) -> None:
    keys = lock_keys(name, "default")
    with _holder(redis_url, name) as holder:
        record = ProcessRecord.decode(
            redis_client.get(process_key("default", process_of(_token(redis_client, keys)) or ""))
        )
        assert record == ProcessRecord(HERE, holder.pid, process_records.started(holder.pid))
        got: list[bool] = []

        def waiter(index: int) -> None:
            lock = Lock(name)
            got.append(lock.acquire(wait=20))
            if got[-1]:
                lock.release()

        start_queued(1, waiter, redis_client, keys.queue)
        assert redis_client.pttl(keys.lease) > 20_000  # the holder's lease, renewed
        os.kill(holder.pid, signal.SIGKILL)
        wait_until(lambda: got, 25, "the waiter's acquisition")
        assert got == [True]


@needs_proc
def test_a_live_holder_is_looked_up_once_and_its_death_ends_the_lease_it_holds(
    redis_url, redis_client
):
    """Each join tells the watch whom it found holding the lock. A live holder on this machine
    is looked up once (its pidfd then tells of its death): later sightings, of any of its
    leases, wake no thread. At its death, each lock it was seen holding is read: the lease it
    holds is ended, whichever of its tokens was seen last."""
    keys = lock_keys("watched-once", "default")
    with _holder(redis_url, "watched-once") as holder:
        value = redis_client.get(keys.lease)
        token = _token(redis_client, keys)
        owner = process_of(token)
        dead_holder_watch.seen("default", keys, value)
        wait_until(
            lambda: owner in dead_holder_watch._settled, 10, "the watch to look the holder up"
        )
        other = value.replace(token.encode(), f"{owner}00000000".encode())
        dead_holder_watch.seen("default", keys, other)  # another lease of the same lock, seen last
        assert not dead_holder_watch._woken  # (a settled holder: its sightings wake nobody)
        os.kill(holder.pid, signal.SIGKILL)
        # Its lease (30 s, renewed: 20 s left at least) is ended by the watch, not by time.
        wait_until(lambda: not redis_client.exists(keys.lease), 15, "its lease to be ended")


@contextlib.contextmanager
def _holder(redis_url: str, name: str) -> Iterator[Any]:
    """A process of this machine that holds lock ``name`` with the default lease, renewed."""
    ready = SPAWN.Event()
    holder = SPAWN.Process(target=workers.hold_lock_until_killed, args=(redis_url, name, ready))
    holder.start()
    try:
        assert ready.wait(60)
        yield holder
    finally:
        holder.kill()
        holder.join(10)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1)")
@needs_proc
def test_a_holder_in_another_pid_namespace_is_never_cut_short(redis_url, redis_client):
    """Killed or not, a holder in another PID namespace keeps its lease until it runs out: its
    pid means nothing here (here, it may be another process, or none)."""
    keys = lock_keys("namespaced-holder", "default")
    command = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-m",
               "tests.support.dead_holder", redis_url, "namespaced-holder"]  # fmt: skip
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as holder:
        try:
            _held_in_another_namespace(holder, redis_client, keys)
        finally:
            holder.kill()
            redis_client.delete(keys.lease)


def _held_in_another_namespace(holder, redis_client, keys) -> None:
    if holder.stdout.readline().strip() != "held":
        holder.kill()
        pytest.skip(f"cannot make a PID namespace here: {holder.stderr.read().strip()}")
    token = _token(redis_client, keys)
    record = ProcessRecord.decode(redis_client.get(process_key("default", process_of(token))))
    assert record is not None
    assert record.place != HERE
    assert record.pid == 1  # (here, pid 1 is alive, and another process)
    [pid] = _pids_running(holder.args[-2])  # the holder, as this namespace numbers it
    assert not Lock("namespaced-holder").acquire(wait=1.5)  # held, by a live holder
    holder.kill()  # (--kill-child: the holder dies with unshare)
    holder.wait(10)
    wait_until(lambda: process_records.started(pid) is None, 10, "the holder to die")
    assert not Lock("namespaced-holder").acquire(wait=1.5)  # and its lease runs on
    assert _token(redis_client, keys) == token
    assert redis_client.pttl(keys.lease) > 20_000


def _pids_running(redis_url: str) -> list[int]:
    """The pids of tests.support.dead_holder processes on ``redis_url``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as file:
                    arguments = file.read().split(b"\0")
            except OSError:
                continue
            if (
                b"tests.support.dead_holder" in arguments
                and redis_url.encode() in arguments
                and (b"unshare" not in arguments[0])
            ):
                found.append(int(entry))
    return found


@needs_proc
def test_a_waiter_without_the_watch_waits_for_the_lease(redis_url, redis_client, settings):
    """``DJANGO_REDIS_LOCK_DEAD_HOLDERS = False``: the lease bounds recovery, as it did."""
    settings.DJANGO_REDIS_LOCK_DEAD_HOLDERS = False
    keys = lock_keys("unwatched", "default")
    with _holder(redis_url, "unwatched") as holder:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)
        assert not Lock("unwatched").acquire(wait=1.5)
        assert redis_client.pttl(keys.lease) > 20_000
    redis_client.delete(keys.lease)


def _token(client, keys) -> str:
    value = client.get(keys.lease)
    assert value is not None
    return value.decode().partition("|")[0]
