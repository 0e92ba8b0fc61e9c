"""Sentinel: locks are taken on the primary that django-redis' SentinelClient finds, and
with replica confirmation a failover is never silent.

The failover tests pin down what a ``SENTINEL FAILOVER`` does to held locks and to waiters,
as observed with redis-py's ``SentinelConnectionPool``: a pooled connection keeps talking to
the server it was opened to. Only a new connection asks Sentinel where the primary is (and,
finding it moved, makes the pool drop its idle connections to the old one). So a process whose
pool has connections enough keeps using the replaced primary until Sentinel demotes it, about
10 s after the election (Sentinel waits for the old primary to be seen up for a while first),
and that demotion closes every client connection of the old primary (``CLIENT KILL TYPE
normal``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.sentinel import Sentinel

from django_redis_lock import Lock, LockBackendError, LockNotOwned, get_redis_client, lock_lost
from django_redis_lock.primitives.keys import lock_keys
from tests.support.helpers import RENEWED_LEASE

# django-redis keeps connection pools per URL for the whole process: each test's Sentinel
# setup gets a service name of its own, so that no test reuses an earlier test's pool.
_setups = iter(range(1_000_000))


def _start_failover(sentinel_client, master):
    """``SENTINEL FAILOVER``, retried while Sentinel answers NOGOODSLAVE: it judges a replica
    fit only after it has heard from it for a while, which a test that has just set the
    replica up may not have given it."""
    deadline = time.monotonic() + 15
    while True:
        try:
            sentinel_client.execute_command("SENTINEL", "FAILOVER", master)
            return
        except redis.ResponseError as error:
            if "NOGOODSLAVE" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # no event to wait on: a bounded probe


def wait_until(predicate, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():  # Sentinel's gossip has no event to wait on: a bounded probe
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def sentinel_setup(settings, redis_server_factory):
    master = f"mymaster{next(_setups)}"
    primary = redis_server_factory(args=["--repl-diskless-sync-delay", "0"])
    # Promoted, the replica serves the demoted old primary's full resync at once, too.
    replica = redis_server_factory(
        args=["--replicaof", primary.host, str(primary.port), "--repl-diskless-sync-delay", "0"]
    )
    primary_client = redis.Redis.from_url(primary.url)
    wait_until(
        lambda: primary_client.info("replication").get("slave0", {}).get("state") == "online",
        what="the replica",
    )
    primary_client.set("replication-check", "1")
    assert primary_client.execute_command("WAIT", 1, 10_000) == 1
    sentinels = [
        redis_server_factory(
            sentinel=[
                f"sentinel monitor {master} {primary.host} {primary.port} 2",
                f"sentinel down-after-milliseconds {master} 1000",
                f"sentinel failover-timeout {master} 10000",
            ]
        )
        for _ in range(3)
    ]
    sentinel_client = redis.Redis.from_url(sentinels[0].url)
    wait_until(
        lambda: sentinel_client.sentinel_master(master).get("num-slaves", 0) >= 1,
        what="Sentinel to see the replica",
    )
    settings.DJANGO_REDIS_CONNECTION_FACTORY = "django_redis.pool.SentinelConnectionFactory"
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{master}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "SENTINELS": [(s.host, s.port) for s in sentinels],
                "CONNECTION_POOL_CLASS": "redis.sentinel.SentinelConnectionPool",
            },
        }
    }
    return primary, replica, sentinel_client, master


def test_locks_are_taken_on_the_primary(sentinel_setup):
    primary, _, _, _ = sentinel_setup
    with Lock("via-sentinel", timeout=30):
        assert redis.Redis.from_url(primary.url).exists(lock_keys("via-sentinel", "default").lease)


def test_with_replica_confirmation_a_failover_is_never_silent(settings, sentinel_setup):
    """Without confirmation, a holder keeps renewing on the replaced primary (which Sentinel
    demotes only at its next check, every 10 s) while the new primary's copy of its lease runs
    out: two holders, silently. With MIN_REPLICAS, renewals must be confirmed too: the stale
    primary (no replica any more) and the new one (none yet) cannot, so the holder keeps
    retrying until its lease would end and then reports the loss. A lease longer than the
    failover (the default 30 s) rides it out once the old primary rejoins as a replica."""
    _, replica, sentinel_client, master = sentinel_setup
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 4  # shorter than the demotion: it cannot ride it out
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1
    settings.DJANGO_REDIS_LOCK_REPLICA_TIMEOUT = 0.3
    lost = threading.Event()
    lock_lost.connect(lambda **kwargs: lost.set(), weak=False, dispatch_uid="failover")
    try:
        holder = Lock("across-failover")
        holder.acquire()
        _start_failover(sentinel_client, master)
        wait_until(
            lambda: int(sentinel_client.execute_command(
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", master)[1]) == replica.port,
            what="the failover",
        )  # fmt: skip
        assert lost.wait(15), "a holder whose renewals were not confirmed did not report it"
        assert holder.lost
    finally:
        lock_lost.disconnect(dispatch_uid="failover")


# -- failovers while locks are held ---------------------------------------------------------


def _query_once(server, *command):
    with redis.Redis.from_url(server.url) as client:
        return client.execute_command(*command)


def _query(server, *command):
    """One command (a read, or idempotent) on a connection of its own, tried again once if
    the connection is closed under it: the old primary's demotion closes them all."""
    try:
        return _query_once(server, *command)
    except redis.ConnectionError:
        return _query_once(server, *command)


def _token(server, name):
    lease = _query(server, "GET", lock_keys(name, "default").lease)
    return lease.decode().split("|", 1)[0] if lease is not None else None


def _role(server):
    return _query(server, "ROLE")[0].decode()


def _replicated(primary, replica, holders):
    """Acknowledged by the replica: a write of ours, so every earlier write (the leases, the
    queues); ``WAIT`` counts the acknowledgements of this connection's writes only."""
    with redis.Redis.from_url(primary.url) as client, client.pipeline(transaction=False) as pipe:
        pipe.set("replication-mark", "1")
        pipe.execute_command("WAIT", 1, 1000)
        assert pipe.execute()[1] == 1
    for name, token in holders.items():
        assert _token(replica, name) == token


def _warm(pool, connections=4):
    """Idle connections enough for what follows, opened now (to the primary of now)."""
    borrowed = [pool.get_connection() for _ in range(connections)]
    for connection in borrowed:
        pool.release(connection)


def _fail_over(settings, sentinel_client, master, replica):
    """``SENTINEL FAILOVER``, then wait until a new connection would be sent to the replica:
    redis-py asks ``SENTINEL MASTERS`` (which names the new primary a little after
    ``GET-MASTER-ADDR-BY-NAME`` does) of the Sentinels in order."""
    sentinels = Sentinel(settings.CACHES["default"]["OPTIONS"]["SENTINELS"])
    _start_failover(sentinel_client, master)
    wait_until(
        lambda: sentinels.discover_master(master) == (replica.host, replica.port),
        timeout=15,
        what="Sentinel to promote the replica",
    )
    for sentinel in sentinels.sentinels:
        sentinel.close()


class Waiter(threading.Thread):
    """``acquire(wait=...)`` in a thread of its own. A hold belongs to the thread that took it,
    so what is asked of the lock afterwards (``call``) runs in that thread too."""

    def __init__(self, name: str, wait: float) -> None:
        super().__init__(name=f"waiter-{name}", daemon=True)
        self.lock = Lock(name, timeout=30)  # a fixed lease: no renewal to run into
        self.wait = wait
        self.done = threading.Event()
        self.outcome: Any = None  # True, False, or the exception acquire() raised
        self.started_at = self.finished_at = 0.0
        self._requests: queue.Queue[Any] = queue.Queue()

    def run(self) -> None:
        self.started_at = time.monotonic()
        try:
            self.outcome = self.lock.acquire(wait=self.wait)
        except Exception as exc:
            self.outcome = exc
        self.finished_at = time.monotonic()
        self.done.set()
        while (request := self._requests.get()) is not None:
            function, answer = request
            try:
                answer.put(function(self.lock))
            except Exception as exc:
                answer.put(exc)

    def call(self, function: Callable[[Lock], Any]) -> Any:
        """``function(lock)`` in this thread; its result, or the exception it raised."""
        assert self.done.wait(10), "the waiter is still waiting"
        answer: queue.Queue[Any] = queue.Queue()
        self._requests.put((function, answer))
        return answer.get(timeout=10)

    def stop(self) -> None:
        self._requests.put(None)
        self.join(10)


def _start_waiters(primary, names, wait=25):
    waiters = {name: Waiter(name, wait) for name in names}
    for waiter in waiters.values():
        waiter.start()
    wait_until(
        lambda: all(
            _query(primary, "LLEN", lock_keys(name, "default").queue) == 1 for name in names
        ),
        what="the waiters to queue",
    )
    return waiters


def test_failover_without_replica_confirmation(settings, sentinel_setup):
    """What happens across a failover, no DJANGO_REDIS_LOCK_MIN_REPLICAS. Two locks are held,
    their leases replicated; a waiter is queued on each.

    Between the election and the old primary's demotion, this process' pooled connections
    still go to the old primary: a release there ("released") wakes its waiter there, which
    takes the lock (acquire() returns True), while the new primary still holds the released
    lease. The other waiter ("kept"), blocked server-side on the old primary, goes on waiting
    when Sentinel demotes it: the demotion closes its connection, which ends that wait as
    interrupted, and the waiter looks again, on the new primary. After the demotion the
    client is on the new primary: the lease that was replicated is still there, owned() is
    True, and release() frees it and wakes that waiter there. The lock the waiter took on the old
    primary is gone (owned() False, release() raises LockNotOwned), and the release that went
    to the old primary is lost: the new primary keeps that lease until it runs out."""
    primary, replica, sentinel_client, master = sentinel_setup
    kept, released = Lock("kept", timeout=30), Lock("released", timeout=30)
    assert kept.acquire()
    assert released.acquire()
    kept_token, released_token = kept.token, released.token
    waiters = _start_waiters(primary, ["kept", "released"])
    try:
        _replicated(primary, replica, {"kept": kept_token, "released": released_token})
        _warm(get_redis_client().connection_pool)
        _fail_over(settings, sentinel_client, master, replica)

        # The window: the new primary is elected, the old one not yet demoted.
        assert _role(primary) == "master"
        released.release()  # on the old primary
        late = waiters["released"]
        assert late.done.wait(5), "the waiter was not woken on the old primary"
        assert late.outcome is True
        late_token = late.call(lambda lock: lock.token)
        assert _token(primary, "released") == late_token
        assert _token(replica, "released") == released_token  # not released on the new one
        assert not waiters["kept"].done.is_set()

        wait_until(lambda: _role(primary) == "slave", timeout=20, what="the demotion")
        demoted_at = time.monotonic()
        survivor = waiters["kept"]
        assert not survivor.done.wait(1), f"the waiter stopped waiting: {survivor.outcome!r}"

        # Now on the new primary.
        assert kept.owned()
        kept.release()
        assert survivor.done.wait(5), "the waiter was not woken on the new primary"
        assert survivor.outcome is True
        assert survivor.finished_at > demoted_at
        assert _token(replica, "kept") == survivor.call(lambda lock: lock.token)
        assert survivor.call(lambda lock: lock.release()) is None
        assert not kept.locked()
        assert late.call(lambda lock: lock.owned()) is False
        assert isinstance(late.call(lambda lock: lock.release()), LockNotOwned)
        assert _token(replica, "released") == released_token
        assert _query(replica, "PTTL", lock_keys("released", "default").lease) > 10_000
        assert Lock("released", timeout=5).acquire(wait=0) is False
        again = Lock("kept", timeout=5)
        assert again.acquire(wait=0)
        again.release()
    finally:
        for waiter in waiters.values():
            waiter.stop()


def test_a_waiter_gets_the_lock_once_the_client_follows_the_new_primary(settings, sentinel_setup):
    """No MIN_REPLICAS. The client follows the new primary as soon as one new connection asks
    Sentinel: redis-py then drops the pool's idle connections to the old primary, and those
    in use when they come back. Here the test makes the pool ask (``get_master_address()``,
    what opening a connection does: a busy process opens one more now and then). The
    holder's release then lands on the new primary, whose copy of the lease it frees (the
    old primary still has it), and the waiter, blocked on the old primary, looks again at the
    end of its block (at most 2 s) on the new primary, where it is first in line: it gets the
    lock, within its wait, before any demotion."""
    primary, replica, sentinel_client, master = sentinel_setup
    holder = Lock("handed-over", timeout=30)
    assert holder.acquire()
    token = holder.token
    waiter = _start_waiters(primary, ["handed-over"])["handed-over"]
    try:
        _replicated(primary, replica, {"handed-over": token})
        _fail_over(settings, sentinel_client, master, replica)
        pool = get_redis_client().connection_pool
        assert pool.get_master_address() == (replica.host, replica.port)

        assert holder.owned()
        holder.release()
        released_at = time.monotonic()
        assert _token(primary, "handed-over") == token  # the old primary never heard of it
        assert waiter.done.wait(5)
        assert waiter.outcome is True
        assert waiter.finished_at - released_at < 3
        assert _token(replica, "handed-over") == waiter.call(lambda lock: lock.token)
        assert _role(primary) == "master"  # all of it before the demotion
        assert waiter.call(lambda lock: lock.release()) is None
    finally:
        waiter.stop()


def test_failover_with_replica_confirmation(settings, sentinel_setup):
    """The same failover with DJANGO_REDIS_LOCK_MIN_REPLICAS = 1. The held, confirmed lease
    survives it as without confirmation. What differs: the waiter woken on the old primary
    (by a release that went there) does not take the lock silently: the old primary has no
    replica left, so its acquisition is unconfirmed, released again, and acquire() raises
    LockBackendError. The unconfirmed write makes the client ask Sentinel where the primary
    is: its idle connections to the old one are dropped, and the connection the other waiter
    is blocked on is closed when it comes back, so that waiter goes on waiting, on the new
    primary. There owned() and release() work, and the release wakes that waiter; but the new
    primary has no replica until the old one is demoted and resynced, so its acquisition is
    unconfirmed too, and nobody can take a lock meanwhile. The release that went to the old
    primary is lost."""
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1
    primary, replica, sentinel_client, master = sentinel_setup
    kept, released = Lock("kept", timeout=30), Lock("released", timeout=30)
    assert kept.acquire()
    assert released.acquire()
    kept_token, released_token = kept.token, released.token
    waiters = _start_waiters(primary, ["kept", "released"])
    try:
        _replicated(primary, replica, {"kept": kept_token, "released": released_token})
        _warm(get_redis_client().connection_pool)
        _fail_over(settings, sentinel_client, master, replica)

        released.release()  # on the old primary
        late = waiters["released"]
        assert late.done.wait(5), "the waiter was not woken on the old primary"
        assert isinstance(late.outcome, LockBackendError), late.outcome
        assert "only 0 of the 1 replicas" in str(late.outcome)
        assert _token(primary, "released") is None  # taken and released again there
        other = waiters["kept"]
        assert not other.done.wait(1), f"the other waiter stopped waiting: {other.outcome!r}"

        assert kept.owned()
        kept.release()
        assert other.done.wait(10), "the other waiter was not woken on the new primary"
        assert isinstance(other.outcome, LockBackendError), other.outcome
        assert "only 0 of the 1 replicas" in str(other.outcome)
        assert _token(replica, "kept") is None  # released, and the waiter's try given back
        assert _token(primary, "kept") == kept_token  # released on the new primary only
        with pytest.raises(LockBackendError, match="only 0 of the 1 replicas"):
            Lock("kept", timeout=5).acquire(wait=0)
        assert _token(replica, "kept") is None
        assert _token(replica, "released") == released_token
        assert _role(primary) == "master"  # all of it before the demotion
    finally:
        for waiter in waiters.values():
            waiter.stop()


def test_an_unconfirmed_acquisition_leaves_other_waiters_waiting(settings, sentinel_setup):
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1
    settings.DJANGO_REDIS_LOCK_REPLICA_TIMEOUT = 0.2
    primary, replica, _, _ = sentinel_setup
    holder = Lock("busy", timeout=30)
    assert holder.acquire()
    waiter = _start_waiters(primary, ["busy"], wait=20)["busy"]
    try:
        _query(replica, "REPLICAOF", "NO", "ONE")  # nothing confirms any more
        with pytest.raises(LockBackendError, match="only 0 of the 1 replicas"):
            Lock("other", timeout=30).acquire()
        assert not waiter.done.wait(1), f"the waiter stopped waiting: {waiter.outcome!r}"
    finally:
        holder.release()
        waiter.stop()


def test_renewals_follow_the_new_primary_before_the_old_one_is_demoted(settings, sentinel_setup):
    """No MIN_REPLICAS. A renewal first asks Sentinel where the primary is, so a holder whose
    lease is shorter than the ~10 s until the old primary is demoted renews it on the new
    primary, not on the old one (where it would run out on the new one: a second holder)."""
    primary, replica, sentinel_client, master = sentinel_setup
    held = Lock("short-lease", timeout=5, auto_renew=True)
    assert held.acquire()
    token = held.token
    try:
        _replicated(primary, replica, {"short-lease": token})
        _fail_over(settings, sentinel_client, master, replica)
        threading.Event().wait(6)  # more than a lease, and still before the demotion
        assert _role(primary) == "master"  # still in the window
        assert _token(replica, "short-lease") == token  # renewed on the new primary
        assert not held.lost
        assert Lock("short-lease", timeout=5).acquire(wait=0) is False
    finally:
        held.release()
    assert _token(replica, "short-lease") is None


def test_semaphore_through_sentinel_with_replica_confirmation(settings, sentinel_setup):
    from django_redis_lock import Semaphore
    from django_redis_lock.primitives.keys import permit_keys

    primary, _, _, _ = sentinel_setup
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1
    settings.DJANGO_REDIS_LOCK_TIMEOUT = RENEWED_LEASE  # (no permit lapses meanwhile)
    semaphore = Semaphore("via-sentinel:renders", limit=2)
    with semaphore:
        client = redis.Redis.from_url(primary.url)
        holders = permit_keys("via-sentinel:renders", "default").holders
        score = client.zscore(holders, semaphore.token)
        wait_until(lambda: client.zscore(holders, semaphore.token) != score, 10, "a renewal")
        second = Semaphore("via-sentinel:renders", limit=2, wait=0)
        assert second.acquire()
        assert not Semaphore("via-sentinel:renders", limit=2, wait=0).acquire()
        # Given back, not left to a collected object: its renewal would go on talking to this
        # test's servers after they stop (redis-py's reconnects draw on the random module,
        # which a Hypothesis test then running in this process takes for its own misuse).
        second.release()
