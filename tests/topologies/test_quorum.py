"""Quorum mode on three real, independent redis-server processes (one stopped, two stopped,
one paused), with processes contending. The promises every topology keeps are in
``test_contract.py``."""

from __future__ import annotations

import copy
import io
import logging
import os
import resource
import signal
import threading
import time

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redis_lock import (
    Lock,
    LockBackendError,
    LockNotAcquired,
    LockNotOwned,
    get_redis_client,
    registry,
    run_once,
    signals,
)
from django_redis_lock.primitives.keys import lock_keys
from tests.locks.test_lock_concurrency import PROCESSES, run_workers
from tests.support import workers
from tests.support.helpers import (
    RENEWED_LEASE,
    lease_token,
    plant_lease,
    renewed_after,
    wait_until,
)
from tests.support.proxy import HOLD_REPLIES, TcpProxy
from tests.support.topologies import QUORUM_MEMBERS

MEMBERS = QUORUM_MEMBERS


def lease_key(name):
    return lock_keys(name, "redlock").lease


def members_with(quorum, settings, socket_timeout, **locations):
    """Every member with ``socket_timeout`` (and at ``locations``, by alias, where given)."""
    caches = copy.deepcopy(quorum.caches)
    for alias in MEMBERS:
        caches[alias]["OPTIONS"]["SOCKET_TIMEOUT"] = socket_timeout
        caches[alias]["LOCATION"] = locations.get(alias, caches[alias]["LOCATION"])
    settings.CACHES = caches


def test_held_on_every_server_and_released_from_all(quorum):
    key = lease_key("q:basic")
    with Lock("q:basic", using="redlock") as held:
        assert [lease_token(client, key) for client in quorum.clients] == [held.token] * 3
        assert held.owned()
        assert Lock("q:basic", using=MEMBERS).locked()  # the same lock, named by its members
        assert 29 < held.ttl() <= 30
        assert not Lock("q:basic", using="redlock").acquire(wait=0)
    assert not any(client.exists(key) for client in quorum.clients)
    assert not Lock("q:basic", using="redlock").locked()


def test_mutual_exclusion_processes_no_lost_updates(quorum, redis_url, redis_client):
    rounds = 100
    results = run_workers(
        workers.count_under_quorum_lock, redis_url, quorum.caches, "q:processes", rounds
    )
    assert sum(overlap for overlap, _ in results) == 0
    assert int(redis_client.get("counter")) == PROCESSES * rounds


def test_one_server_stopped_locking_goes_on(quorum):
    held = Lock("q:one-down", using="redlock", timeout=RENEWED_LEASE, auto_renew=True)
    held.acquire()
    quorum.servers[2].stop()
    # Held past a lease after the stop: renewed by the two left.
    renewed_after(held, time.monotonic() + RENEWED_LEASE)
    assert held.owned()
    assert not held.lost
    held.release()
    for _ in range(5):
        with Lock("q:one-down", using="redlock", fencing=True, wait=10) as again:
            assert again.fencing_token
    key = lease_key("q:one-down")
    assert not quorum.clients[0].exists(key)
    assert not quorum.clients[1].exists(key)


def test_a_refusal_and_a_stopped_server_wait_for_the_third_answer(quorum, settings):
    """One server stopped, the lock held by someone else. The first refusal and the stopped
    server do not decide yet between "taken" and "too few servers": the third server's answer
    does, even when it comes late, so a waiter is told the lock is taken, not that the quorum
    is unavailable (however late the timer resumes it on a loaded machine: within the 60 s
    socket timeout)."""
    members_with(quorum, settings, socket_timeout=60)
    holder = Lock("q:held-one-down", using="redlock")
    holder.acquire()
    quorum.servers[2].stop()
    slow = quorum.servers[1]
    for _ in range(3):
        os.kill(slow.pid, signal.SIGSTOP)
        resume = threading.Timer(0.05, os.kill, (slow.pid, signal.SIGCONT))
        resume.start()
        try:
            assert Lock("q:held-one-down", using="redlock").acquire(wait=0) is False
        finally:
            resume.join()
            os.kill(slow.pid, signal.SIGCONT)
    holder.release()


def test_one_grant_one_refusal_one_stopped_is_simply_taken(quorum, caplog):
    key = lease_key("q:split-one-down")
    plant_lease(quorum.clients[0], key, px=30000)
    quorum.servers[2].stop()
    assert Lock("q:split-one-down", using="redlock").acquire(wait=0) is False
    assert not quorum.clients[1].exists(key)  # granted there, given back
    assert "no majority granted" not in caplog.text  # not mistaken for a lease too short


def test_two_servers_stopped_fail_clearly_and_at_once(quorum):
    quorum.servers[1].stop()
    quorum.servers[2].stop()
    started = time.monotonic()
    with pytest.raises(LockBackendError) as failure:
        Lock("q:two-down", using="redlock").acquire(wait=120)
    # It did not wait out the 2 min wait, nor hang: two refused connections take
    # milliseconds, and a loaded machine cannot make them a minute.
    assert time.monotonic() - started < 60
    message = str(failure.value)
    assert "only 1 of the 3 servers of quorum 'redlock' answered" in message
    assert "2 are needed to take a lock" in message
    assert "q1: ConnectionError" in message
    assert "q2: ConnectionError" in message
    # What the one server left granted was given back.
    assert not quorum.clients[0].exists(lease_key("q:two-down"))


def test_losing_the_majority_while_held_is_reported(quorum):
    lost = threading.Event()

    def on_lost(sender, **kwargs):
        lost.set()

    signals.lock_lost.connect(on_lost)
    try:
        held = Lock("q:majority-lost", using="redlock", timeout=RENEWED_LEASE, auto_renew=True)
        held.acquire()
        key = lease_key("q:majority-lost")
        quorum.clients[0].delete(key)  # a minority lost: still ours
        # Past a lease after that: renewed on the other two.
        renewed_after(held, time.monotonic() + RENEWED_LEASE)
        assert not lost.is_set()
        assert quorum.clients[1].exists(key)
        assert quorum.clients[2].exists(key)
        assert not held.lost
        quorum.clients[1].delete(key)  # now a majority is gone
        assert lost.wait(5)
        assert held.lost
        with pytest.raises(LockNotOwned):
            held.release()
    finally:
        signals.lock_lost.disconnect(on_lost)


def test_a_paused_server_holds_nobody_up(quorum, settings):
    """A server that stops answering (SIGSTOP: it still accepts connections) costs its vote,
    not a socket timeout per call."""
    members_with(quorum, settings, socket_timeout=60)
    paused = quorum.servers[2]
    with Lock("q:paused", using="redlock"):
        pass  # connections to every server exist
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        for _ in range(20):
            with Lock("q:paused", using="redlock", wait=1) as held:
                assert held.owned()
        elapsed = time.monotonic() - started
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    # Waiting for the paused server even once costs the socket timeout (60 s; an attempt's
    # own limit, its lease less the drift allowance, 29.7 s); 20 rounds on two servers take
    # well under a second, and a loaded machine cannot make them 20.
    assert elapsed < 20
    # Back, it runs what it was sent, in order: nothing is left behind there.
    key = lease_key("q:paused")
    wait_until(lambda: not quorum.clients[2].exists(key), 10, "the paused server to catch up")
    with Lock("q:paused", using="redlock", wait=1):
        assert quorum.clients[2].exists(key)  # and it takes part again


def test_late_answers_arriving_with_the_current_one_are_sorted_out(quorum, settings):
    """A server that resumes sends its late answers and the current one together: the current
    one must be found in the client's buffer, not waited for until the socket timeout."""
    members_with(quorum, settings, socket_timeout=60)
    paused = quorum.servers[2]
    name = "q:late-answers"
    with Lock(name, using="redlock"):
        pass  # connections to every server exist
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        with Lock(name, using="redlock"):  # decided by servers 0 and 1: server 2 owes two answers
            pass
        plant_lease(quorum.clients[1], lease_key(name), px=30000)
        resume = threading.Timer(0.1, os.kill, (paused.pid, signal.SIGCONT))
        resume.start()
        started = time.monotonic()
        # Server 0 grants, server 1 refuses: server 2 decides, once it resumes.
        late = Lock(name, using="redlock", timeout=120)  # (its attempt's own limit: 119 s)
        assert late.acquire(wait=0)
        # Not the 60 s socket timeout: 0.1 s, which a loaded machine cannot make 20.
        assert time.monotonic() - started < 20
        resume.join()
        late.release()
    finally:
        os.kill(paused.pid, signal.SIGCONT)


@pytest.fixture
def slow_member(quorum, settings):
    """``configure(socket_timeout)``: q1 reached through a proxy that can hold its answers back
    (a slow server: ``proxy.mode = HOLD_REPLIES``, then ``proxy.let_go()``), every member with
    that socket timeout; returns the proxy."""
    proxies = []

    def configure(socket_timeout):
        server = quorum.servers[1]
        proxy = TcpProxy(server.host, server.port)
        proxies.append(proxy)
        members_with(quorum, settings, socket_timeout, q1=proxy.url)
        return proxy

    yield configure
    for proxy in proxies:
        proxy.let_go()
        proxy.close()


def _held_on_q0_and_q1(quorum, name, scripts):
    """A lock held on q0 and q1, a majority: q2 had another holder's lease when it was taken,
    and says "not ours" to its release. ``scripts="flushed"``: none loaded on the servers, as
    after they started (the release's first answers are NOSCRIPT)."""
    plant_lease(quorum.clients[2], lease_key(name), px=60_000)
    held = Lock(name, using="redlock", timeout=60)
    assert held.acquire(wait=0)
    assert [lease_token(client, lease_key(name)) for client in quorum.clients] == [
        held.token, held.token, "someone-else"
    ]  # fmt: skip
    if scripts == "flushed":
        for client in quorum.clients:
            client.script_flush()
    else:
        with Lock(f"{name}:other", using="redlock"):
            pass  # release.lua loaded everywhere
    return held


@pytest.mark.parametrize("scripts", ["loaded", "flushed"])
def test_a_release_waits_for_the_member_whose_answer_decides_it(quorum, slow_member, scripts):
    """Issue 40: q0 released the lock and q2 says it was not ours: q1's answer decides, and it
    is late. The release waits for it (up to the members' socket timeout, here 60 s) and
    counts it, instead of giving up on it and failing. With no script loaded, the first
    answers are NOSCRIPT: they do not count as failures (which decided the release at once,
    before q1 could answer); the script is sent whole to each, in place."""
    proxy = slow_member(socket_timeout=60)
    name = f"q:slow-release-{scripts}"
    held = _held_on_q0_and_q1(quorum, name, scripts)
    returned, seen = threading.Event(), []

    def late_q1():
        seen.append(proxy.held.wait(30))  # q1 got the release and answered: held back...
        returned.wait(0.5)  # ...half a second, or longer on a loaded machine: within the bound
        seen.append(returned.is_set())
        proxy.let_go()

    proxy.mode = HOLD_REPLIES
    late = threading.Thread(target=late_q1)
    late.start()
    outcome = _outcome(held.release)
    returned.set()
    late.join(30)
    assert seen == [True, False]  # the release was still waiting when q1's answer came
    assert outcome == "released"
    assert [lease_token(client, lease_key(name)) for client in quorum.clients] == [
        None, None, "someone-else"
    ]  # fmt: skip


def _outcome(call):
    try:
        call()
    except Exception as exc:  # what the test reports
        return f"{type(exc).__name__}: {exc}"
    return "released"


def test_a_release_counts_once_no_majority_can_hold_the_lock_any_more(quorum, slow_member, caplog):
    """q0 released it, q2 says it was not ours, q1 stays silent past the bound (the members'
    socket timeout, 0.5 s here): nobody can hold the lock on a majority now, and the worst
    left to the user is a copy on q1, which ends with the lease. The release counts, with a
    warning naming q1; it does not fail."""
    proxy = slow_member(socket_timeout=0.5)
    name = "q:silent-release"
    held = _held_on_q0_and_q1(quorum, name, "loaded")
    proxy.mode = HOLD_REPLIES
    with caplog.at_level(logging.WARNING, logger="django_redis_lock"):
        held.release()  # no error
    assert not held.owned()
    [warning] = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert "q1" in warning
    assert "ends with its lease" in warning
    # (Only its answer is late: q1 runs the release, when the proxy has passed it on, which
    # a loaded machine may not have done yet. Read later, its answer is read and forgotten.)
    wait_until(
        lambda: [lease_token(client, lease_key(name)) for client in quorum.clients]
        == [None, None, "someone-else"],
        5, "q1 to run the release",
    )  # fmt: skip
    proxy.let_go()
    with Lock(f"{name}:next", using="redlock", wait=5):
        pass  # q1 answers what comes next, in order


def test_a_release_too_few_servers_answered_says_who_released_it(quorum, slow_member):
    """q1 silent past the bound and q2 stopped: the lock may still be held on them, a
    majority; the release fails, saying what each server did."""
    proxy = slow_member(socket_timeout=0.5)
    name = "q:unknown-release"
    held = Lock(name, using="redlock", timeout=60)
    assert held.acquire(wait=0)
    quorum.servers[2].stop()
    proxy.mode = HOLD_REPLIES
    with pytest.raises(LockBackendError) as failure:
        held.release()
    message = str(failure.value)
    assert "only 1 of the 3 servers of quorum 'redlock' answered (1 released it)" in message
    assert "2 are needed to release a lock" in message
    assert "q1: Silent: no answer within" in message
    assert "q2: ConnectionError" in message


def test_a_renewal_too_few_servers_confirmed_says_what_each_did(quorum, slow_member):
    """q0 renews, q2 refuses (not ours), q1 is silent past the bound: two answered, and two
    are needed, but only one renewed it; the message says so."""
    proxy = slow_member(socket_timeout=0.5)
    held = _held_on_q0_and_q1(quorum, "q:unconfirmed-renewal", "loaded")
    proxy.mode = HOLD_REPLIES
    with pytest.raises(LockBackendError) as failure:
        held.extend(60)
    message = str(failure.value)
    assert "only 1 of the 3 servers of quorum 'redlock' renewed it (2 answered, 1 refusing)" in (
        message
    )
    assert "2 are needed to renew a lock (q1: Silent: no answer within" in message
    proxy.let_go()
    held.release()


def test_fencing_tokens_increase_across_majorities(quorum):
    """A token is the largest of the granting servers' clocks, in microseconds: it increases
    from one majority to the next, a server restarted empty included, and nothing is kept on
    the servers after a release."""
    name = "q:fence"
    with Lock(name, using="redlock", fencing=True) as first:
        one = first.fencing_token
    quorum.servers[0].restart()  # empty: nothing of the lock survives there
    quorum.servers[1].stop()  # the next majority is servers 0 and 2
    with Lock(name, using="redlock", fencing=True) as second:
        two = second.fencing_token
    assert two > one
    assert not any(client.keys("*") for client in (quorum.clients[0], quorum.clients[2]))


def test_a_failed_attempt_gives_back_what_it_got(quorum):
    key = lease_key("q:split")
    for client in quorum.clients[:2]:  # someone else holds it on a majority
        plant_lease(client, key, px=30000)
    with pytest.raises(LockNotAcquired), Lock("q:split", using="redlock", wait=0):
        pass
    assert not quorum.clients[2].exists(key)  # granted there, then given back
    assert [lease_token(client, key) for client in quorum.clients[:2]] == ["someone-else"] * 2


def test_a_grant_that_outlived_its_lease_does_not_count(quorum, caplog):
    # 2 ms of lease, less the 2 ms drift allowance: no majority can answer in time.
    assert not Lock("q:too-short", using="redlock", timeout=0.002).acquire(wait=0)
    assert "no majority granted lock:{q:too-short} within its lease" in caplog.text
    assert not any(client.exists(lease_key("q:too-short")) for client in quorum.clients)


def test_default_alias_may_name_a_quorum(quorum, settings):
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "redlock"
    calls = []

    @run_once("q-job", ttl=60)
    def job():
        calls.append(1)

    job()
    job()
    assert calls == [1]
    held = Lock("q:default")
    held.acquire()
    assert all(client.exists(lease_key("q:default")) for client in quorum.clients)
    listed = list(registry.iter_locks())
    assert [info.name for info in listed].count("q:default") == 1  # listed once
    assert registry.get_lock("q:default").token == held.token
    quorum.servers[0].stop()  # the registry reads what the others hold
    assert registry.get_lock("q:default").token == held.token
    assert "q:default" in [info.name for info in registry.iter_locks()]
    assert registry.force_release("q:default", held.token)
    assert not held.owned()
    with pytest.raises(LockNotOwned):
        held.release()


def test_redis_locks_says_what_it_could_not_read(quorum, settings):
    """One server down: every lock is still listed (each is held on a majority), with a
    warning naming the server. Two down: a lock may be missing, so the command says so and
    fails (status 3), and ``show`` does not answer "not held" from a minority."""
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "redlock"
    held = Lock("q:cli")
    held.acquire()
    quorum.servers[0].stop()
    out, err = io.StringIO(), io.StringIO()
    call_command("redis_locks", "list", stdout=out, stderr=err)
    assert "q:cli" in out.getvalue()
    assert "Warning: not read (a majority was, so no lock is missing): q0: " in err.getvalue()
    quorum.servers[1].stop()
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match="may be incomplete: only 1 of the 3 servers") as caught:
        call_command("redis_locks", "list", stdout=out, stderr=err)
    assert caught.value.returncode == 3
    assert "No locks are held" not in err.getvalue()
    with pytest.raises(CommandError, match="needed to tell whether") as caught:
        call_command("redis_locks", "show", "q:other")
    assert caught.value.returncode == 3


def test_the_admin_page_lists_quorum_locks(quorum, settings, admin_client):
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "redlock"
    with Lock("q:admin", label="on three servers"):
        page = admin_client.get("/admin/django_redis_lock/heldlock/")
        assert page.status_code == 200
        assert page.content.decode().count("on three servers") == 1
        assert "Not all servers of the quorum" not in page.content.decode()
        quorum.servers[0].stop()
        page = admin_client.get("/admin/django_redis_lock/heldlock/")
    html = page.content.decode()
    assert html.count("on three servers") == 1  # what the other two hold
    assert "Not all servers of the quorum could be read" in html
    assert "Unreachable: q0: " in html


@pytest.mark.parametrize(
    ("using", "error", "message"),
    [
        (["q0", "q1"], ValueError, "at least 3 cache aliases"),
        (["q0", "q0", "q1"], ValueError, "each cache alias once"),
        (["q0", "", "q1"], TypeError, "cache aliases"),
        ({"q0", "q1", "q2"}, TypeError, "cache alias or quorum name"),
    ],
)
def test_bad_quorums_are_refused(using, error, message):
    with pytest.raises(error, match=message):
        Lock("q:bad", using=using)


def test_bad_quorum_settings(quorum, settings):
    settings.DJANGO_REDIS_LOCK_QUORUMS = {"redlock": ["q0", "q1"]}
    with pytest.raises(ImproperlyConfigured, match=r"QUORUMS \['redlock'\]: A quorum needs"):
        Lock("q:bad", using="redlock").acquire()
    settings.DJANGO_REDIS_LOCK_QUORUMS = {"redlock": ["q0", "q1", "nowhere"], "q0": MEMBERS}
    messages = {message.id: message for message in run_checks()}
    assert {"django_redis_lock.E001", "django_redis_lock.E007"} <= set(messages)
    assert messages["django_redis_lock.E001"].msg.startswith(
        "DJANGO_REDIS_LOCK_QUORUMS['redlock']: The cache alias 'nowhere' is not in"
    )
    with pytest.raises(ImproperlyConfigured, match="names a quorum"):
        get_redis_client("redlock")


def test_sockets_numbered_past_1024_are_watched_too(quorum):
    """select() cannot watch a descriptor numbered 1024 or more; a busy process has them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with Lock("q:many-files", using="redlock") as held:
            assert held.owned()
    finally:
        for descriptor in spare:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_lock_many_on_a_quorum_takes_each_member_on_a_majority(quorum):
    from django_redis_lock import lock_many

    names = ["q:many:b", "q:many:a"]
    other = Lock("q:many:b", using="redlock")
    assert other.acquire()
    assert not lock_many(names, using="redlock", wait=0.1).acquire()  # all or nothing
    assert all(lease_token(client, lease_key("q:many:a")) is None for client in quorum.clients)
    other.release()
    with lock_many(names, using="redlock") as group:
        for lock in group.locks:
            tokens = [lease_token(client, lease_key(lock.name)) for client in quorum.clients]
            assert tokens == [lock.token] * 3
    assert not group.held
