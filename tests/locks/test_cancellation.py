"""Cancellation at every suspension point: nothing of ours is left held by nobody.

For each public async operation, the harness cancels the task at its 1st, 2nd, ... Nth
suspension (each time the coroutine gives the event loop back: a connection, a send, a reply,
a blocking wait), until the operation finishes before the Nth. After each run it checks the
promise of docs/locks.md ("Cancellation"): either the operation finished and the caller holds
what it returned (the test then releases it), or ``CancelledError`` came out and nothing of
ours is held, at once: the lock is free for anyone, no queue entry of ours hands it to a task
that is gone, every key of ours has an expiry, and the object works again.

The sync twin interrupts at each step of the backend seam, on a real connection of the
suite's server (``InterruptingConnection``): before a request is sent, after it is sent and
before its reply is read, and after the reply, by raising ``KeyboardInterrupt`` there, as a
signal handler does between two bytecodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import redis
from django.test import AsyncRequestFactory
from redis.connection import Connection

from django_redis_lock import (
    Lock,
    LockNotOwned,
    Semaphore,
    get_redis_client,
    lock_contended,
    lock_many,
)
from django_redis_lock.backends.cluster_wire import reread_slot_map
from django_redis_lock.backends.scripts import RELEASE
from django_redis_lock.primitives.background import process_records
from django_redis_lock.primitives.keys import lock_keys
from django_redis_lock.task_guards import reservations
from django_redis_lock.task_guards.policy import TaskGuard
from django_redis_lock.task_guards.runs import GuardedRun, Verdict
from tests.conftest import django_redis_caches
from tests.support import factories
from tests.support.helpers import keys_without_ttl, run_async, wait_until
from tests.support.proxy import DROP_REPLIES, PASS
from tests.support.topologies import QUORUM_MEMBERS
from tests.testapp import views

# -- the harness ------------------------------------------------------------------------------


class CancelAt:
    """Awaits ``coroutine``, cancelling the awaiting task at its ``n``th suspension, exactly
    as ``task.cancel()`` from outside would land there (the future it waits on is cancelled,
    and ``CancelledError`` is raised at that ``await``). ``suspensions``: how many it made."""

    def __init__(self, coroutine: Awaitable, n: int) -> None:
        self.coroutine, self.n, self.suspensions = coroutine, n, 0

    def __await__(self):
        inner = self.coroutine.__await__()
        value, error = None, None
        while True:
            try:
                yielded = inner.send(value) if error is None else inner.throw(error)
            except StopIteration as stop:
                return stop.value
            self.suspensions += 1
            if self.suspensions == self.n:
                asyncio.current_task().cancel()
            try:
                value, error = (yield yielded), None
            except BaseException as exc:
                value, error = None, exc


@dataclass
class Outcome:
    n: int
    cancelled: bool
    result: object = None


@dataclass
class Sweep:
    """What the cancellations at every suspension point of one operation gave."""

    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def points(self) -> int:
        return len(self.outcomes)

    @property
    def cancelled(self) -> int:
        return sum(outcome.cancelled for outcome in self.outcomes)


async def sweep(
    operation: Callable[[], Awaitable],
    check: Callable[[Outcome], Awaitable[None]],
    *,
    most: int = 200,
) -> Sweep:
    """Run ``operation()`` once for each n = 1, 2, ..., cancelled at its nth suspension, and
    ``check`` each outcome, until a run finishes before its nth (every point was covered)."""
    done = Sweep()
    for n in range(1, most + 1):
        cancel_at = CancelAt(operation(), n)
        try:
            outcome = Outcome(n, cancelled=False, result=await cancel_at)
        except asyncio.CancelledError as error:
            outcome = Outcome(n, cancelled=True, result=type(error))
            uncancel = getattr(asyncio.current_task(), "uncancel", None)  # (Python 3.11+)
            if uncancel is not None:
                uncancel()
        # Exactly CancelledError, never a subclass: Python 3.11 and 3.12's asyncio.timeout,
        # wait_for and TaskGroup turn only that into TimeoutError, or let it through.
        assert not outcome.cancelled or outcome.result is asyncio.CancelledError, outcome
        done.outcomes.append(outcome)
        try:
            await check(outcome)
        except AssertionError as failure:
            raise AssertionError(f"cancelled at suspension {n}: {failure}") from failure
        if cancel_at.suspensions < n:
            return done
    raise AssertionError(f"still suspending after {most} points: no end to the sweep")


def nothing_of_ours_held(clients, *names: str, within: float = 0) -> None:
    """The promise after a cancellation: anyone takes every lock at once (or ``within`` that
    many seconds: an interrupted sync call's give-back is sent, not waited for), and no key of
    ours is left without an expiry on any server (``clients``: a client, or a topology's)."""
    for client in getattr(clients, "clients", [clients]):
        assert keys_without_ttl(client) == []
    for name in names:
        other = Lock(name, timeout=5, wait=within)
        assert other.acquire(), f"{name!r} is held by nobody after a cancellation"
        other.release()


# -- the async operations ---------------------------------------------------------------------

_names = itertools.count()


def fresh(prefix: str) -> str:
    return f"cancel:{prefix}:{next(_names)}"


def test_an_uncontended_aacquire_cancelled_anywhere_holds_or_leaves_nothing(topology):
    async def main():
        name = fresh("flat")
        lock = Lock(name, timeout=30, wait=1)

        async def check(outcome):
            if not outcome.cancelled:
                assert outcome.result is True
                assert lock.owned()
                await lock.arelease()
            assert lock.token is None  # the object does not believe it holds
            nothing_of_ours_held(topology, name)

        return await sweep(lambda: lock.aacquire(), check)

    done = run_async(main())
    assert done.cancelled >= 1, done  # a connection, a reply at least


def test_a_contended_aacquire_cancelled_anywhere_leaves_no_place_in_line(topology):
    """Cancelled while it joins the line or waits in it: the holder's release must not hand
    the lock to the task that is gone (it would be held by nobody until the hand-off ends)."""

    async def main():
        name = fresh("line")
        holder = Lock(name, timeout=30)

        async def check(outcome):
            assert not outcome.cancelled or lock.token is None
            if not outcome.cancelled and outcome.result:
                await lock.arelease()
            holder.release()  # to the next in line: nobody, if ours stepped out
            nothing_of_ours_held(topology, name)

        lock = Lock(name, timeout=30, wait=0.3)

        def operation():
            assert holder.acquire(wait=0)
            return lock.aacquire()

        return await sweep(operation, check)

    done = run_async(main())
    assert done.cancelled >= 1, done


def test_an_aacquire_handed_the_lock_and_cancelled_anywhere_passes_it_on(topology):
    """The holder releases as soon as ours queues (``lock_contended``): the lease is handed to
    ours while it waits, and the cancellation lands before, while or after it learns so."""

    async def main():
        name = fresh("handed")
        holder = Lock(name, timeout=30)
        lock = Lock(name, timeout=30, wait=5)

        def release_holder(**kwargs):
            if kwargs["name"] == name and holder.token is not None:
                holder.release()

        lock_contended.connect(release_holder, weak=False, dispatch_uid="cancel-handed")

        async def check(outcome):
            if not outcome.cancelled:
                assert outcome.result is True
                await lock.arelease()
            if holder.token is not None:
                holder.release()
            nothing_of_ours_held(topology, name)

        def operation():
            assert holder.acquire(wait=0)
            return lock.aacquire()

        try:
            return await sweep(operation, check)
        finally:
            lock_contended.disconnect(dispatch_uid="cancel-handed")

    done = run_async(main())
    assert done.cancelled >= 1, done


def test_async_with_cancelled_anywhere_releases_or_never_held(topology):
    async def main():
        name = fresh("with")
        lock = Lock(name, timeout=30, wait=1)

        async def operation():
            async with lock:
                await asyncio.sleep(0)  # the body: cancelled there, the exit releases

        async def check(outcome):
            assert lock.token is None
            nothing_of_ours_held(topology, name)

        return await sweep(operation, check)

    done = run_async(main())
    assert done.cancelled >= 1, done  # in the enter, the body and the exit


def test_an_arelease_cancelled_anywhere_releases(topology):
    """A release is not cut short by a cancellation: it completes, then the cancellation goes
    on (a release left half done would keep the lock for a lease)."""

    async def main():
        name = fresh("release")
        lock = Lock(name, timeout=30, wait=1)

        async def operation():
            assert await lock.aacquire()
            await asyncio.sleep(0)  # (a suspension before the release, to cancel at)
            await lock.arelease()

        async def check(outcome):
            if lock.token is not None:  # cancelled before the release began
                await lock.arelease()
            nothing_of_ours_held(topology, name)

        return await sweep(operation, check)

    done = run_async(main())
    assert done.cancelled >= 1, done


def test_an_aextend_cancelled_anywhere_keeps_the_lock_consistent(redis_client):
    async def main():
        name = fresh("extend")
        lock = Lock(name, timeout=30, wait=1)
        assert await lock.aacquire()

        async def check(outcome):
            assert lock.owned()  # still ours, extended or not
            assert redis_client.pttl(lock_keys_of(name)) > 0

        done = await sweep(lambda: lock.aextend(60), check)
        await lock.arelease()
        nothing_of_ours_held(redis_client, name)
        return done

    done = run_async(main())
    assert done.cancelled >= 1, done


def test_a_semaphore_aacquire_cancelled_anywhere_holds_or_leaves_nothing(topology):
    if topology.kind == "quorum":
        pytest.skip("Semaphores do not support quorum mode (a clear NotImplementedError).")

    async def main():
        name = fresh("permits")
        semaphore = Semaphore(name, 1, timeout=30, wait=1)

        async def check(outcome):
            if not outcome.cancelled:
                assert outcome.result is True
                await semaphore.arelease()
            assert semaphore.token is None
            other = Semaphore(name, 1, timeout=5, wait=0)
            assert other.acquire(), "the permit is held by nobody after a cancellation"
            other.release()
            assert keys_without_ttl(topology.clients[0]) == []

        return await sweep(lambda: semaphore.aacquire(), check)

    done = run_async(main())
    assert done.cancelled >= 1, done


def test_lock_many_cancelled_anywhere_holds_all_or_none(topology):
    async def main():
        names = [fresh("many") for _ in range(3)]

        async def operation():
            async with lock_many(names, timeout=30, wait=1):
                await asyncio.sleep(0)

        async def check(outcome):
            nothing_of_ours_held(topology, *names)

        return await sweep(operation, check)

    done = run_async(main())
    assert done.cancelled >= 1, done


def test_a_guarded_async_view_cancelled_anywhere_can_be_submitted_again(redis_client):
    """An ASGI server cancels the view's task when the client goes away: the submission's lock
    must not refuse the retry as one still running (409) for a lease."""

    async def main():
        views.async_gate.clear()

        def submission(item):
            return AsyncRequestFactory().post(
                "/async-order/", {"item": item}, headers={"X-Client": "c"}
            )

        items = iter(range(1000))
        item = None

        def operation():
            nonlocal item
            item = f"book-{next(items)}"
            return views.async_order(submission(item))

        async def check(outcome):
            assert keys_without_ttl(redis_client) == []
            retry = await views.async_order(submission(item))
            # Run now, or replayed: the first one's work was done and its answer kept.
            assert retry.status_code == 200, retry.content

        return await sweep(operation, check)

    done = run_async(main())
    assert done.cancelled >= 1, done


def test_a_task_guard_s_start_cancelled_anywhere_leaves_its_run_key_free(redis_client):
    """A run that takes its key, then ends its queue key's reservation (two keys: the guard
    until_and_while_executing), cancelled before its verdict: nobody calls its exit."""

    guard = TaskGuard("cancel.task", lambda x: None, label="", guard="until_and_while_executing")
    done = _run_starts_swept(redis_client, guard)
    assert done.cancelled >= 2, done


def _run_starts_swept(redis_client, guard: TaskGuard) -> Sweep:
    """``GuardedRun.aenter()`` of a job of ``guard``, cancelled at each point: its run key is
    free after (a run that got its verdict exits first; one told RUN holds the key within its
    lease, never one that ran out)."""
    names = guard.names((1,), {})

    async def main():
        runs = []

        def operation():
            run = GuardedRun(guard, names, "job-1", requeued_as_is=False)
            runs.append(run)
            return run.aenter()

        async def check(outcome):
            if not outcome.cancelled:
                if outcome.result is Verdict.RUN:
                    assert runs[-1].lock.held_until > time.monotonic()
                await runs[-1].aexit()
            nothing_of_ours_held(redis_client, names.run)

        return await sweep(operation, check)

    return run_async(main())


def test_a_task_guard_s_start_cancelled_anywhere_as_it_takes_a_lapsed_key_again(
    redis_client, monkeypatch
):
    """The same start, stalled past its key's lease as it ends the job's reservation (a
    worker paused there): it gives the key back and takes it again (``GuardedRun._lapsed``).
    Cancelled at any point of that, its run key is free (or its verdict holds the key again,
    within its lease)."""
    lease = 0.05
    guard = TaskGuard("cancel.lapsed", lambda x: None, label="",
                      guard="until_and_while_executing", guard_timeout=lease)  # fmt: skip
    cancel = reservations.acancel

    async def stalled_cancel(*args, **kwargs):
        await asyncio.sleep(lease * 2)  # (past the key's lease by any clock's reckoning)
        return await cancel(*args, **kwargs)

    monkeypatch.setattr(reservations, "acancel", stalled_cancel)
    done = _run_starts_swept(redis_client, guard)
    assert all(o.result is Verdict.RUN for o in done.outcomes if not o.cancelled), done
    assert done.cancelled >= 4, done  # (taken, stalled, given back, taken again)


def test_lock_many_cancelled_anywhere_as_it_writes_its_process_record_holds_all_or_none(
    redis_client,
):
    """``lock_many`` taking its members in one script writes this process's record first
    (the watch for dead holders reads it) when it is due: cancelled at that write too, it holds
    all or none, and the record has its expiry."""

    async def main():
        names = [fresh("many-record") for _ in range(3)]

        async def operation():
            process_records.recorded.clear()  # (due again: the first acquisition's write)
            async with lock_many(names, timeout=30, wait=1):
                await asyncio.sleep(0)

        async def check(outcome):
            nothing_of_ours_held(redis_client, *names)

        return await sweep(operation, check)

    done = run_async(main())
    assert done.cancelled >= 2, done


def test_a_cancellation_against_a_silent_redis_waits_no_longer_than_its_grace(
    settings, redis_proxy
):
    """Redis stops answering while an acquisition waits for its reply: the cancellation
    waits CANCEL_GRACE (1 s) for it, not the socket timeout (30 s here) on top."""
    settings.CACHES = django_redis_caches(redis_proxy.url, SOCKET_TIMEOUT=30)

    async def main():
        warm = Lock(fresh("warm"), timeout=5)  # (its connection made, its scripts loaded)
        assert await warm.aacquire()
        await warm.arelease()
        redis_proxy.mode = DROP_REPLIES
        task = asyncio.ensure_future(Lock(fresh("silent"), timeout=30, wait=60).aacquire())
        await wait_for_sent(redis_proxy)
        started = time.monotonic()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        redis_proxy.mode = PASS
        return time.monotonic() - started

    # Far above the grace, far below the socket timeout: what a loaded machine cannot blur.
    assert run_async(main()) < 15


async def wait_for_sent(proxy, timeout: float = 10) -> None:
    """Until the proxy has passed a request on whose reply it drops."""
    deadline = time.monotonic() + timeout
    while not proxy.dropped and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert proxy.dropped, "the request never reached Redis"


def lock_keys_of(name: str) -> str:
    return lock_keys(name, "default").lease


# -- the sync twin: KeyboardInterrupt at each step of the backend seam -----------------------


class InterruptingConnection(Connection):
    """A real connection that raises ``KeyboardInterrupt`` at one step of one exchange: the
    ``interrupt_at``th of the steps it counts (before a send, after a send, after a reply)."""

    interrupt_at = 0
    again_at = 0  # (and again at this step: Ctrl-C pressed twice)
    steps = 0
    # Whether redis-py's handshake on a new connection (on_connect: its commands differ
    # between redis-py versions) counts steps too.
    count_handshakes = True
    counting = True
    sent: list[tuple[int, int, bytes]] = []  # (step, port, what) of each send, when kept

    @classmethod
    def keep_sends(cls) -> None:
        cls.sent = []

    @classmethod
    def step(cls) -> None:
        if not cls.counting:
            return
        cls.steps += 1
        if cls.steps in (cls.interrupt_at, cls.again_at):
            raise KeyboardInterrupt

    unread = 0  # (this connection's requests sent and not read: one per send, at least)

    def disconnect(self, *args, **kwargs):
        self.unread = 0
        super().disconnect(*args, **kwargs)

    def on_connect(self, *args, **kwargs):
        cls = type(self)
        counting, cls.counting = cls.counting, cls.count_handshakes
        try:
            super().on_connect(*args, **kwargs)
        finally:
            cls.counting = counting

    def send_packed_command(self, command, check_health=True):
        type(self).step()  # before the request is sent
        super().send_packed_command(command, check_health)
        type(self).sent.append((type(self).steps, self.port, b"".join(map(bytes, command))))
        self.unread += 1
        type(self).step()  # sent, its reply not read yet

    def read_response(self, *args, **kwargs):
        try:
            response = super().read_response(*args, **kwargs)
        finally:  # (an error reply is a reply read; a read cut short drops the connection)
            self.unread = max(self.unread - 1, 0)
        type(self).step()  # the reply read, not yet handed back
        return response


@pytest.fixture
def interrupting(settings, redis_url):
    """The default cache's connections are ``InterruptingConnection``s (a pool of its own)."""
    # Another URL of the same server (a fragment redis-py ignores): a pool of its own, as
    # django-redis keeps one pool per URL for the whole process.
    caches = django_redis_caches(f"{redis_url}#interrupting")
    caches["default"]["OPTIONS"]["CONNECTION_POOL_KWARGS"] = {
        "connection_class": InterruptingConnection
    }
    settings.CACHES = caches
    InterruptingConnection.interrupt_at = InterruptingConnection.steps = 0
    yield InterruptingConnection
    InterruptingConnection.interrupt_at = 0


def interrupted_everywhere(connection_class, operation, check, most=100):
    """Run ``operation`` with an interrupt at each step 1, 2, ... of the seam, ``check`` after
    each, until it finishes before its step; returns the number of steps covered."""
    for step in range(1, most + 1):
        connection_class.steps, connection_class.interrupt_at = 0, step
        try:
            result, interrupted = operation(), False
        except KeyboardInterrupt:
            result, interrupted = None, True
        connection_class.interrupt_at = 0
        check(interrupted, result)
        if connection_class.steps < step:
            return step
    raise AssertionError("no end to the steps")


def no_unread_reply_lent(client) -> None:
    """No idle connection of ``client``'s pool (a Cluster's: of each node's) has a reply still
    to come. (Whether the next command would read it as its own depends on when the reply
    arrives: redis-py drops a connection it lends with a reply already there. So the pools
    are looked at.)"""
    nodes = client.get_nodes() if hasattr(client, "get_nodes") else [client]
    for node in nodes:
        client = getattr(node, "redis_connection", node)
        idle = client.connection_pool._available_connections
        assert [c for c in idle if c.unread] == [], f"{node} lends an unread reply"


def test_a_sync_acquire_interrupted_at_any_step_holds_or_leaves_nothing(
    interrupting, redis_client
):
    name = fresh("sync")
    lock = Lock(name, timeout=30, wait=1)

    def check(interrupted, result):
        if not interrupted:
            assert result is True
            lock.release()
        assert lock.token is None
        no_unread_reply_lent(get_redis_client())  # (a handshake interrupted: its reply)
        nothing_of_ours_held(redis_client, name, within=5)

    assert interrupted_everywhere(interrupting, lock.acquire, check) >= 4


@pytest.fixture
def interrupting_quorum(quorum, settings):
    """The quorum's members' connections are ``InterruptingConnection``s."""
    caches = {alias: {**cache} for alias, cache in quorum.caches.items()}
    for alias in QUORUM_MEMBERS:
        caches[alias]["OPTIONS"] = {
            **caches[alias]["OPTIONS"],
            "CONNECTION_POOL_KWARGS": {"connection_class": InterruptingConnection},
        }
    settings.CACHES = caches
    InterruptingConnection.interrupt_at = InterruptingConnection.steps = 0
    yield quorum
    InterruptingConnection.interrupt_at = InterruptingConnection.again_at = 0
    InterruptingConnection.count_handshakes = True


def test_a_sync_quorum_acquire_interrupted_at_any_step_holds_or_leaves_nothing(
    interrupting_quorum,
):
    """Quorum mode: an acquisition interrupted with its requests out (or between two rounds)
    gives back what it took on every server before the interrupt goes on, behind its
    requests on their connections: no server keeps a lease of it (a majority of them kept
    the lock from anyone for its whole lease)."""
    quorum = interrupting_quorum
    name = fresh("sync-quorum")
    lock = Lock(name, timeout=30, wait=1, using="redlock")
    key = lock_keys(name, "redlock").lease

    def check(interrupted, result):
        if not interrupted:
            assert result is True
            lock.release()
        assert lock.token is None
        for client in quorum.clients:
            wait_until(lambda c=client: not c.exists(key), 5, f"no lease of {name} on {client}")
            assert keys_without_ttl(client) == []

    assert interrupted_everywhere(InterruptingConnection, lock.acquire, check) >= 4


@pytest.fixture
def interrupting_cluster(settings, redis_cluster):
    """The locks' client is a RedisCluster whose connections are ``InterruptingConnection``s;
    yields a plain client of each node (to look at what is left on it)."""
    factories.cluster_url[:] = [redis_cluster.startup_url]
    factories.cluster_connection_class[:] = [InterruptingConnection]
    settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = "tests.support.factories.cluster_client"
    clients = [redis.Redis.from_url(server.url) for server in redis_cluster.servers]
    try:
        get_redis_client()  # (the slot map read before the steps are counted)
        yield clients
    finally:
        InterruptingConnection.interrupt_at = 0
        factories.cluster_connection_class.clear()
        get_redis_client().close()
        for client in clients:
            client.close()


def test_a_sync_cluster_acquire_interrupted_at_any_step_holds_or_leaves_nothing(
    interrupting_cluster,
):
    """Redis Cluster: an acquisition interrupted with its request out gives back what it took,
    behind the request on the node's own connection (the Cluster client's connection is its
    own: a give-back on another could overtake the request). And the interrupted connection
    is dropped, not lent again with its reply unread: through the Cluster client, an
    interrupted ``SCRIPT LOAD``'s reply was read by the next acquisition as its own."""
    name = fresh("sync-cluster")
    lock = Lock(name, timeout=30, wait=1, fencing=True)  # (a script, and its give-back)

    def check(interrupted, result):
        if not interrupted:
            assert result is True
            lock.release()
        assert lock.token is None
        # An interrupted connection was dropped, not lent again with its reply unread (the
        # next caller read it as its own).
        no_unread_reply_lent(get_redis_client())
        nothing_of_ours_held(SimpleNamespace(clients=interrupting_cluster), name, within=5)

    assert interrupted_everywhere(InterruptingConnection, lock.acquire, check) >= 4


def test_a_cluster_slot_map_read_interrupted_at_any_step_lends_no_unread_reply(
    interrupting_cluster,
):
    """The slot map read again after a connection error (``reread_slot_map``) is redis-py's
    Cluster client's, which gives its connection back to the pool however a command ended:
    interrupted between ``CLUSTER SLOTS``'s send and its read, the next lock operation on that
    connection read the slot map as its reply (found by the runtime simulation on a Cluster,
    seed 1117 of ``many``). The idle connections are dropped instead."""
    name = fresh("slot-map")
    client = get_redis_client()

    def check(interrupted, result):
        no_unread_reply_lent(client)
        nothing_of_ours_held(SimpleNamespace(clients=interrupting_cluster), name)

    assert interrupted_everywhere(
        InterruptingConnection, lambda: reread_slot_map(client), check
    ) >= 3  # fmt: skip


def test_a_quorum_release_interrupted_twice_where_its_script_is_not_loaded_releases(
    interrupting_quorum,
):
    """Ctrl-C pressed once a release has gone out to every member, on members that do not
    have the release script yet (their first release, or after a restart: ``NOSCRIPT``), and
    again during its retry: each member runs what it was sent, as one server does (the script
    goes out whole behind an ``EVALSHA`` left unanswered). No member keeps the lease: a
    majority of them kept the lock from everyone for its whole lease."""
    quorum = interrupting_quorum
    members = len(QUORUM_MEMBERS)
    InterruptingConnection.count_handshakes = False  # (the steps: the release's, retry's)
    name = fresh("quorum-release-twice")
    lock = Lock(name, timeout=30, wait=1, using="redlock")
    key = lock_keys(name, "redlock").lease
    sent = 2 * members  # (a step before and after each send: then all have gone out, unless
    # late answers to the acquisition were read first: those combinations are skipped)
    # The second interrupt once the first one's sends have gone out: in the retry.
    for first, again in itertools.product(range(sent, sent + 8), range(sent + 1, sent + 9)):
        assert lock.acquire()
        for client in quorum.clients:
            client.script_flush()
        InterruptingConnection.steps = 0
        InterruptingConnection.keep_sends()
        InterruptingConnection.interrupt_at = first
        InterruptingConnection.again_at = first + again
        with contextlib.suppress(KeyboardInterrupt):
            lock.release(result=b"done", result_ttl=30)
        InterruptingConnection.interrupt_at = InterruptingConnection.again_at = 0
        reached = {port for step, port, what in InterruptingConnection.sent
                   if step < first and RELEASE.sha.encode() in what}  # fmt: skip
        if len(reached) < members:  # (not sent to every member before the first interrupt)
            for client in quorum.clients:
                client.delete(key)
            if lock.token is not None:
                with contextlib.suppress(LockNotOwned):
                    lock.release()
            continue
        where = f"interrupted at steps {first} and {first + again}"
        for client in quorum.clients:
            wait_until(lambda c=client: not c.exists(key), 5, f"no lease on {client}, {where}")
        if lock.token is not None:  # (its release failed twice: kept for a retry, which
            with contextlib.suppress(LockNotOwned):  # finds it released)
                lock.release()
        assert lock.token is None


def test_a_sync_release_interrupted_at_any_step_leaves_nothing(interrupting, redis_client):
    """A release is finished before the interrupt goes on (tried again if it may not have
    reached Redis), with the result it keeps for duplicates: the lock is free, the result
    there, and the object holds nothing."""
    name = fresh("sync-release")
    lock = Lock(name, timeout=30, wait=1)

    def operation():
        interrupting.interrupt_at, armed = 0, interrupting.interrupt_at
        assert lock.acquire()
        interrupting.steps, interrupting.interrupt_at = 0, armed
        lock.release(result=b"the first one's answer", result_ttl=30)

    def check(interrupted, result):
        assert lock.token is None
        no_unread_reply_lent(get_redis_client())
        duplicate = Lock(name, timeout=30).claim(wait=5, want_result=True)
        assert duplicate.result == b"the first one's answer", duplicate
        redis_client.delete(lock_keys(name, "default").result)
        nothing_of_ours_held(redis_client, name, within=5)

    assert interrupted_everywhere(interrupting, operation, check) >= 3
