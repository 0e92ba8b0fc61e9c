"""A lock on a real Redis Cluster whose topology changes under it.

Two kinds of change, each on a private cluster built here (never the session's shared one):

- **Slot migration** (resharding): the lock's hash slot moves to another primary with
  ``CLUSTER SETSLOT IMPORTING/MIGRATING``, ``MIGRATE`` and ``CLUSTER SETSLOT NODE``, so the
  client meets ``ASK`` during the move and ``MOVED`` after it, and must follow them.
- **Failover**: the primary that owns the lock's slot is replaced by its replica, either in a
  coordinated ``CLUSTER FAILOVER`` or after the primary process is SIGKILLed and the cluster
  promotes the replica by itself (``cluster-node-timeout`` 1000 ms keeps that to seconds).

The lock reaches the cluster the way a user's would, through
``DJANGO_REDIS_LOCK_CONNECTION_FACTORY`` (a factory returning a ``RedisCluster``). Nothing is
mocked: every server is a real ``redis-server`` process started here and stopped by its pid.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ResponseError
from redis.retry import Retry

from dev.embedded_redis import EmbeddedRedis, start_cluster_node
from django_redis_lock import Lock, LockBackendError, LockError, LockNotOwned, get_redis_client
from django_redis_lock.core import flows
from django_redis_lock.primitives.keys import lock_keys
from tests.support.helpers import RENEWED_LEASE, renewed_after

T = TypeVar("T")

NODE_TIMEOUT_MS = 1000
CLUSTER_ARGS = [
    "--cluster-enabled", "yes",
    "--cluster-config-file", "nodes.conf",
    "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
    # A replica's first full sync starts at once instead of after the default 5 s.
    "--repl-diskless-sync-delay", "0",
]  # fmt: skip
SLOTS = 16384
NO_RETRY = Retry(NoBackoff(), 0)


def lease_token(client: Any, key: str) -> str | None:
    lease = client.get(key)
    return lease.decode().split("|", 1)[0] if lease is not None else None


def wait_until(predicate: Callable[[], T], timeout: float = 15.0, what: str = "condition") -> T:
    """Poll ``predicate`` every 20 ms until it returns something truthy, and return that.

    Cluster gossip, elections and replication have no event a client could wait on, so a
    bounded poll is the synchronisation; it fails the test instead of waiting for ever.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class KnownBug(Exception):
    """Raised by a test when it sees exactly the misbehaviour it guards against (a bug these
    tests once found), so that the report names it rather than a bare assertion."""


def known_bug(error: Exception, *signs: str) -> Exception:
    """``KnownBug`` if ``error``'s message has every one of ``signs``, else ``error`` itself."""
    return KnownBug(str(error)) if all(sign in str(error) for sign in signs) else error


@dataclass
class Retried:
    """What :func:`retry_backend_errors` saw: the errors raised before the call went through."""

    errors: list[LockBackendError] = field(default_factory=list)


def retry_backend_errors(
    call: Callable[[], T], seen: Retried, timeout: float = 15.0, what: str = "the call"
) -> T:
    """Call until it stops raising ``LockBackendError`` (a failover in progress), at most
    ``timeout`` seconds; every error is recorded in ``seen`` for the test to look at."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except LockBackendError as error:
            seen.errors.append(error)
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} still failed after {timeout}s: {error}") from error
            time.sleep(0.02)


@dataclass
class Node:
    server: EmbeddedRedis
    client: redis.Redis
    id: str

    @property
    def address(self) -> tuple[str, int]:
        assert self.server.port is not None
        return self.server.host, self.server.port

    def cmd(self, *args: Any) -> Any:
        return self.client.execute_command(*args)

    def nodes(self) -> list[list[str]]:
        """This node's ``CLUSTER NODES``, one split line per node."""
        return [line.split() for line in self.cmd("CLUSTER", "NODES").decode().splitlines()]


class Cluster:
    """A private Redis Cluster: ``primaries`` primaries with the slots split evenly, and one
    replica for each primary listed in ``replicated`` (by index)."""

    def __init__(
        self, start: Callable[..., EmbeddedRedis], primaries: int, replicated: tuple[int, ...]
    ) -> None:
        self.nodes: list[Node] = []
        for _ in range(primaries + len(replicated)):
            server = start_cluster_node(start, CLUSTER_ARGS)
            client = redis.Redis(host=server.host, port=server.port, single_connection_client=True)
            self.nodes.append(Node(server, client, client.execute_command("CLUSTER", "MYID")))
            self.nodes[-1].id = self.nodes[-1].id.decode()
        for index in range(primaries):
            first, last = index * SLOTS // primaries, (index + 1) * SLOTS // primaries - 1
            self.nodes[index].cmd("CLUSTER", "ADDSLOTS", *range(first, last + 1))
        host, port = self.nodes[0].address
        for node in self.nodes[1:]:
            node.cmd("CLUSTER", "MEET", host, port)
        wait_until(self._all_met, what="every node to know every other")
        self.replica_of: dict[str, str] = {}  # replica id -> primary id, as built
        for offset, primary in enumerate(replicated):
            replica = self.nodes[primaries + offset]
            replica.cmd("CLUSTER", "REPLICATE", self.nodes[primary].id)
            self.replica_of[replica.id] = self.nodes[primary].id
        wait_until(self._settled, what="the cluster to settle")

    # -- views -----------------------------------------------------------------------------

    def live(self) -> list[Node]:
        return [node for node in self.nodes if node.server.running]

    def node(self, node_id: str) -> Node:
        return next(node for node in self.nodes if node.id == node_id)

    def _all_met(self) -> bool:
        return all(
            len(view) == len(self.nodes) and not any("handshake" in line[2] for line in view)
            for view in (node.nodes() for node in self.nodes)
        )

    def _settled(self) -> bool:
        for node in self.live():
            if b"cluster_state:ok" not in node.cmd("CLUSTER", "INFO"):
                return False
            roles = {line[0]: line for line in node.nodes()}
            for replica, primary in self.replica_of.items():
                if "slave" not in roles[replica][2] or roles[replica][3] != primary:
                    return False
        return all(
            self.node(replica).client.info("replication")["master_link_status"] == "up"
            for replica in self.replica_of
            if self.node(replica).server.running
        )

    def owner(self, slot: int, asked: Node) -> str | None:
        """The id of the primary that ``asked`` says serves ``slot`` (None: nobody)."""
        for line in asked.nodes():
            if "master" not in line[2] or "fail" in line[2]:
                continue
            for served in line[8:]:
                if served.startswith("["):  # "[slot->-id]" / "[slot-<-id]": a migration
                    continue
                first, _, last = served.partition("-")
                if int(first) <= slot <= int(last or first):
                    return line[0]
        return None

    def agreed_owner(self, slot: int) -> str | None:
        """The primary every live node names for ``slot``, once they all agree and are ok."""
        owners = set()
        for node in self.live():
            if b"cluster_state:ok" not in node.cmd("CLUSTER", "INFO"):
                return None
            owners.add(self.owner(slot, node))
        return owners.pop() if len(owners) == 1 else None

    def primary_of(self, slot: int) -> Node:
        owner = wait_until(lambda: self.agreed_owner(slot), what=f"an owner of slot {slot}")
        return self.node(owner)

    def replica_of_primary(self, primary: Node) -> Node:
        return next(self.node(r) for r, p in self.replica_of.items() if p == primary.id)

    # -- changes ---------------------------------------------------------------------------

    def start_migration(self, slot: int, source: Node, target: Node) -> None:
        target.cmd("CLUSTER", "SETSLOT", slot, "IMPORTING", source.id)
        source.cmd("CLUSTER", "SETSLOT", slot, "MIGRATING", target.id)

    def move_keys(self, slot: int, source: Node, target: Node) -> int:
        """MIGRATE every key of ``slot`` from ``source`` to ``target``; how many moved."""
        moved = 0
        while keys := source.cmd("CLUSTER", "GETKEYSINSLOT", slot, 100):
            host, port = target.address
            source.cmd("MIGRATE", host, port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
        return moved

    def finish_migration(self, slot: int, target: Node) -> None:
        # The target first, then everybody else (the order the Cluster spec recommends).
        for node in [target] + [node for node in self.live() if node is not target]:
            node.cmd("CLUSTER", "SETSLOT", slot, "NODE", target.id)

    def migrate(self, slot: int, target: Node) -> int:
        source = self.primary_of(slot)
        assert source is not target
        self.start_migration(slot, source, target)
        moved = self.move_keys(slot, source, target)
        self.finish_migration(slot, target)
        return moved

    def stabilise(self) -> None:
        """Undo an unfinished migration (a test that failed half-way through one)."""
        for node in self.live():
            own = next(line for line in node.nodes() if "myself" in line[2])
            for served in own[8:]:
                if served.startswith("["):
                    slot = int(served[1:].split("-")[0])
                    node.cmd("CLUSTER", "SETSLOT", slot, "STABLE")

    def close(self) -> None:
        for node in self.nodes:
            node.client.close()


def slot_of(name: str) -> int:
    return key_slot(lock_keys(name, "default").lease.encode())


def held_on(node: Node, name: str) -> str | None:
    """The token of the lease of ``name`` as stored on ``node`` (read on the node itself,
    ``READONLY`` so a replica answers too)."""
    client = redis.Redis(
        host=node.server.host, port=node.server.port, single_connection_client=True
    )
    try:
        client.execute_command("READONLY")
        lease = client.get(lock_keys(name, "default").lease)
    finally:
        client.close()
    return lease.decode().split("|", 1)[0] if lease is not None else None


@pytest.fixture
def point_locks_at(settings) -> Iterator[Callable[..., RedisCluster]]:
    """Make the locks use a Cluster client that starts from ``node`` (through
    ``DJANGO_REDIS_LOCK_CONNECTION_FACTORY``, as a user would), built with ``options``; every
    client that factory builds is closed at the end."""
    made: list[RedisCluster] = []

    def point(node: Node, **options: Any) -> RedisCluster:
        host, port = node.address

        def cluster_client(alias: str) -> RedisCluster:
            made.append(RedisCluster(host=host, port=port, **options))
            return made[-1]

        settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = cluster_client
        client = get_redis_client()
        assert isinstance(client, RedisCluster)
        return client

    yield point
    for client in made:
        client.close()


@pytest.fixture
def new_lock(point_locks_at) -> Iterator[Callable[..., Lock]]:
    """``Lock(...)``, released at the end of the test if a failed assertion left it held (so
    its renewal does not go on against a cluster that is gone)."""
    made: list[Lock] = []

    def make(name: str, **options: Any) -> Lock:
        made.append(Lock(name, **options))
        return made[-1]

    yield make
    for lock in made:
        for _level in range(10):  # re-entrant levels; a LockBackendError keeps the hold
            if lock.token is None:
                break
            with contextlib.suppress(LockError):
                lock.release()  # whatever it raises, it stops the renewal


# -- slot migration ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def _migration_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three primaries, no replicas; shared by the migration tests of this module only (moving
    a slot changes nothing a later test relies on: each one asks where its slot is)."""
    started: list[EmbeddedRedis] = []

    def start(**kwargs: Any) -> EmbeddedRedis:
        server = EmbeddedRedis(directory=tmp_path_factory.mktemp("moving"), **kwargs).start()
        started.append(server)
        return server

    cluster = None
    try:
        cluster = Cluster(start, primaries=3, replicated=())
        yield cluster
    finally:
        if cluster is not None:
            cluster.close()
        for server in started:
            server.stop()


@pytest.fixture
def moving(_migration_cluster: Cluster, point_locks_at) -> Iterator[Cluster]:
    """The migration cluster, emptied and stable, with the locks pointed at it."""
    _migration_cluster.stabilise()
    for node in _migration_cluster.live():
        node.cmd("FLUSHALL")
    point_locks_at(_migration_cluster.nodes[0])
    yield _migration_cluster
    _migration_cluster.stabilise()


def wait_blocked(node: Node) -> None:
    """Until a client (the waiter) is blocked on ``node`` (in its wake-up ``BLPOP``)."""
    wait_until(
        lambda: node.client.info("clients")["blocked_clients"] >= 1,
        what="the waiter to block on its wake-up list",
    )


def other_primary(cluster: Cluster, slot: int) -> Node:
    source = cluster.primary_of(slot)
    return next(node for node in cluster.nodes if node is not source)


def test_held_lock_follows_its_slot_to_another_primary(moving, new_lock):
    """Everything a holder does keeps working after its slot moved: the client is sent on by
    MOVED. Renewal in particular: Redis confirms a renewal of the lease more than a lease
    after the move only because the renewals went to the new primary."""
    name = "moving:held"
    keys = lock_keys(name, "default")
    lock = new_lock(name, timeout=RENEWED_LEASE, auto_renew=True, fencing=True, reentrant=True)
    assert lock.acquire(wait=0)
    assert lock.acquire(wait=0)  # re-entered: a second level, counted in the process
    first_fence = lock.fencing_token
    source = moving.primary_of(slot_of(name))
    target = other_primary(moving, slot_of(name))
    assert source.client.exists(keys.lease) == 1

    moved = moving.migrate(slot_of(name), target)

    assert moved == 1  # the lease: the lock's only key
    assert moving.primary_of(slot_of(name)) is target
    assert lease_token(target.client, keys.lease) == lock.token
    with pytest.raises(ResponseError, match=r"^(MOVED )?\d+ "):  # MovedError from redis-py 6
        source.client.exists(keys.lease)
    # More than one lease later: still ours, renewed on the new primary.
    renewed_after(lock, time.monotonic() + RENEWED_LEASE)
    assert not lock.lost
    assert lock.owned()
    assert lock.locked()
    assert 0 < target.client.pttl(keys.lease) <= RENEWED_LEASE * 1000
    assert lock.fencing_token == first_fence

    lock.release()  # one level of two
    assert lock.locked()
    assert lock.owned()
    lock.release()
    assert not lock.locked()
    assert not lock.owned()
    assert not target.client.exists(keys.lease)

    after = new_lock(name, timeout=5, fencing=True)
    assert after.acquire(wait=0)
    try:
        assert after.fencing_token > first_fence
    finally:
        after.release()


def test_waiter_blocked_during_the_move_gets_the_lock(moving, new_lock, monkeypatch):
    """A waiter blocked on its wake-up list on the old primary is sent on by MOVED (the old
    primary unblocks it when the slot leaves) and is woken by the release on the new one.
    Its blocks last a minute (the holder's lease, its wait and BLOCK_CAP all longer): only a
    wake-up ends one sooner."""
    monkeypatch.setattr(flows, "BLOCK_CAP", 60.0)
    name = "moving:waited"
    keys = lock_keys(name, "default")
    holder = new_lock(name, timeout=60, fencing=True)
    assert holder.acquire(wait=0)
    got: dict[str, Any] = {}

    def wait_for_it() -> None:
        waiter = Lock(name, fencing=True, timeout=10)
        try:
            got["acquired"] = waiter.acquire(wait=120)
            got["fence"] = waiter.fencing_token
            got["at"] = time.monotonic()
            if got["acquired"]:
                waiter.release()
        except BaseException as error:  # reported to the test below
            got["error"] = error

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    source = moving.primary_of(slot_of(name))
    wait_until(lambda: source.client.exists(keys.queue), what="the waiter to queue")
    wait_blocked(source)
    target = other_primary(moving, slot_of(name))

    moved = moving.migrate(slot_of(name), target)

    assert moved >= 3  # lease, queue, waiters
    assert target.client.lrange(keys.queue, 0, -1) != []
    holder_fence = holder.fencing_token
    released_at = time.monotonic()
    holder.release()
    thread.join(60)
    assert not thread.is_alive()
    assert "error" not in got, got.get("error")
    assert got["acquired"] is True
    # Woken by the release, not by a later re-check (a minute on): a loaded machine gets a
    # woken thread going in far less than 30 s.
    assert got["at"] - released_at < 30
    assert got["fence"] > holder_fence


def asking(node: Node, *args: Any) -> Any:
    """One command on ``node`` with ``ASKING`` first: how the importing node of a slot is
    read while the slot migrates (without it, the node answers MOVED to the old owner)."""
    node.cmd("ASKING")
    return node.cmd(*args)


def test_lock_taken_and_used_while_its_slot_migrates(moving, new_lock):
    """During the move (source MIGRATING, target IMPORTING) a lock with no key on the source
    yet is taken on the target through an ASK redirect, is seen held by everyone, and is where
    it should be once the move ends. A lock whose lease is still on the source is read,
    renewed and refused to others there."""
    stayed = "moving:stayed"
    # Two names in one slot (the slot is what moves): a readable name is its own hash tag, so
    # look for a partner of `stayed` among names of the same form.
    slot = slot_of(stayed)
    asked = next(
        candidate
        for candidate in (f"moving:asked:{index}" for index in range(200_000))
        if slot_of(candidate) == slot
    )
    source = moving.primary_of(slot)
    target = other_primary(moving, slot)
    early = new_lock(stayed, timeout=10, fencing=True)
    assert early.acquire(wait=0)

    moving.start_migration(slot, source, target)

    lock = new_lock(asked, timeout=10, fencing=True)
    assert lock.acquire(wait=0)  # no key on the source: ASK, taken on the target
    assert lock.fencing_token > early.fencing_token
    asked_keys = lock_keys(asked, "default")
    # Not on the source, which sends us to the target (AskError from redis-py 6).
    with pytest.raises(ResponseError, match=r"^(ASK )?\d+ "):
        source.client.exists(asked_keys.lease)
    assert asking(target, "GET", asked_keys.lease).decode().split("|", 1)[0] == lock.token
    assert lock.locked()
    assert lock.owned()
    assert Lock(asked, timeout=10).acquire(wait=0) is False  # held, for everyone
    lock.extend(20)
    assert 10 < lock.ttl() <= 20
    # The lease that is still on the source: served there.
    assert early.owned()
    assert early.locked()
    assert Lock(stayed, timeout=10).acquire(wait=0) is False
    early.extend(30)
    assert 20 < early.ttl() <= 30

    assert moving.move_keys(slot, source, target) == 1  # `stayed`: its lease, its only key
    moving.finish_migration(slot, target)

    assert moving.primary_of(slot) is target
    fence = lock.fencing_token
    for held in (lock, early):
        assert held.owned()
        held.release()
        assert not held.locked()
    after = new_lock(asked, timeout=5, fencing=True)
    assert after.acquire(wait=0)
    assert after.fencing_token > fence
    after.release()


_MIGRATING_SCRIPTS = (
    "Every script is given all the keys it may touch (KEYS), as Redis Cluster asks. While the "
    "slot is MIGRATING, a script whose keys are partly on the source and partly not (the queue "
    "keys exist only while someone waits) is answered TRYAGAIN before it runs: redis-py's "
    "Cluster client retries that for a while, then raises 'TTL exhausted'."
)


def test_release_while_the_lease_is_still_on_the_migrating_source(moving, new_lock):
    (
        """While the slot is MIGRATING, the release script's keys are partly on the source (the
    lease) and partly nowhere (the queue): Redis answers TRYAGAIN and runs nothing, so
    release() raises LockBackendError, the hold and the lease are kept, and the release can be
    retried, and works once the migration is done. """
        + _MIGRATING_SCRIPTS
    )
    name = "moving:release-during-migration"
    keys = lock_keys(name, "default")
    slot = slot_of(name)
    source = moving.primary_of(slot)
    target = other_primary(moving, slot)
    lock = new_lock(name, timeout=10)
    assert lock.acquire(wait=0)
    moving.start_migration(slot, source, target)  # no key moved yet: all still on the source
    with pytest.raises(LockBackendError, match=r"TTL exhausted|TRYAGAIN"):
        lock.release()
    assert lock.token is not None  # the hold is kept, for a retry...
    assert lease_token(source.client, keys.lease) == lock.token  # ...and still held
    moving.move_keys(slot, source, target)
    moving.finish_migration(slot, target)
    lock.release()
    assert not lock.locked()
    assert not lock.lost


def test_waiter_queueing_while_the_lease_is_still_on_the_migrating_source(moving, new_lock):
    """A waiter that finds the lock held while its slot migrates cannot queue (TRYAGAIN: the
    queue keys are not where the lease is) and looks again until its wait is over: acquire
    returns False, as for any held lock, instead of raising."""
    name = "moving:wait-during-migration"
    slot = slot_of(name)
    source = moving.primary_of(slot)
    holder = new_lock(name, timeout=10)
    assert holder.acquire(wait=0)
    moving.start_migration(slot, source, other_primary(moving, slot))
    assert Lock(name, timeout=10).acquire(wait=0) is False  # a mere try works
    waiter = new_lock(name, timeout=10)
    assert waiter.acquire(wait=0.2) is False  # waited, the lock being held: not an error


# -- the Cluster client's own retries --------------------------------------------------------


def answers_within(node: Node, seconds: float) -> bool:
    client = redis.Redis(
        host=node.server.host, port=node.server.port, socket_timeout=seconds, retry=NO_RETRY
    )
    try:
        return bool(client.ping())
    except redis.TimeoutError:
        return False
    finally:
        client.close()


# Keeps the server busy (no other client is served meanwhile) for ARGV[1] ms: a stall, as a
# slow command, a fork or a swapped-out page would cause, without the DEBUG command.
_STALL = """
local function now() local t = redis.call('TIME') return t[1] * 1000 + t[2] / 1000 end
local stop = now() + tonumber(ARGV[1])
while now() < stop do end
return 1
"""


def test_release_is_not_repeated_by_the_cluster_clients_retries(moving, new_lock, point_locks_at):
    """redis-py's Cluster client retries a command after a timeout (10 times by default), when
    it may have run: lock commands name their node, which makes redis-py send them once. A
    release() sent while the server stalls is applied once: a repeat would find the lease gone
    and call it lost (LockNotOwned)."""
    name = "retried:release"
    keys = lock_keys(name, "default")
    node = moving.primary_of(slot_of(name))
    point_locks_at(moving.nodes[0], socket_timeout=0.2)
    lock = new_lock(name, timeout=30)
    assert lock.acquire(wait=0)
    lock.release()  # the scripts are loaded on the node now, as in any process that ran a while
    assert lock.acquire(wait=0)
    stall = threading.Thread(target=lambda: node.cmd("EVAL", _STALL, 0, 1000))
    stall.start()
    try:
        wait_until(lambda: not answers_within(node, 0.05), what="the server to stall")
        try:
            lock.release()  # sent while the server does not answer
        except LockBackendError:
            pass  # it timed out: acceptable, as long as it was not repeated
        except LockNotOwned as error:
            raise KnownBug(f"release() raised {error!r}") from error
    finally:
        stall.join(5)
    if lock.token is not None:  # timed out: the retry the docs promise is quiet
        # (On a loaded machine a new connection's handshake may itself outlast the 0.2 s
        # socket timeout just after the stall: a release that times out may be retried.)
        wait_until(lambda: answers_within(node, 0.05), what="the server to answer again")
        for _ in range(5):
            with contextlib.suppress(LockBackendError):
                lock.release()
                break
    assert lock.token is None
    assert not lock.lost
    assert not node.client.exists(keys.lease)


def test_waiting_longer_than_the_cluster_clients_socket_timeout(moving, new_lock, point_locks_at):
    """The wake-up wait is timed by the lock on the node's own connection, as on one server,
    not cut by the Cluster client's socket_timeout (and then retried)."""
    point_locks_at(moving.nodes[0], socket_timeout=1.0)
    holder = new_lock("retried:wait", timeout=30)
    assert holder.acquire(wait=0)
    waiter = new_lock("retried:wait", timeout=10)
    started = time.monotonic()
    try:
        acquired = waiter.acquire(wait=1.5)
    except LockBackendError as error:
        waited = time.monotonic() - started
        assert waited > 10  # 11 attempts of 1 s each, not the 1.5 s asked for
        raise known_bug(error, "TimeoutError: Timeout reading from socket") from error
    assert acquired is False
    # Its 1.5 s, not 11 of the client's attempts (11 s): 6.5 s left for a loaded machine.
    assert time.monotonic() - started < 8


# -- failover ------------------------------------------------------------------------------


@pytest.fixture
def replicated(redis_server_factory) -> Iterator[Cluster]:
    """Three primaries, each with one replica: a primary can be lost without losing its slots."""
    cluster = Cluster(redis_server_factory, primaries=3, replicated=(0, 1, 2))
    yield cluster
    cluster.close()


def bystander(cluster: Cluster, *busy: Node) -> Node:
    """A live node that is neither of ``busy`` (and not their replicas): where the client
    starts from, so that its first contact does not disappear in the test."""
    excluded = {node.id for node in busy} | {
        r for r, p in cluster.replica_of.items() if p in {node.id for node in busy}
    }
    return next(node for node in cluster.live() if node.id not in excluded)


def coordinated_failover(cluster: Cluster, replica: Node, slot: int) -> Node:
    """``CLUSTER FAILOVER`` on ``replica``; returns once everyone agrees it serves ``slot``
    and the old primary has turned into its replica."""
    old_primary = cluster.node(cluster.replica_of[replica.id])
    assert replica.cmd("CLUSTER", "FAILOVER") == b"OK"
    wait_until(lambda: cluster.agreed_owner(slot) == replica.id, what="the replica's promotion")
    wait_until(
        lambda: old_primary.client.info("replication")["role"] == "slave",
        what="the old primary to turn replica",
    )
    return old_primary


def test_coordinated_failover_keeps_the_lock(replicated, point_locks_at, new_lock):
    """``CLUSTER FAILOVER`` on the replica: the primary stops writes, the replica catches up
    and takes over, so nothing is lost. A holder with a 2 s lease keeps it (renewed on the
    new primary, the client sent there by MOVED), release works, and fencing tokens go on
    increasing."""
    name = "failover:coordinated"
    slot = slot_of(name)
    primary = replicated.primary_of(slot)
    replica = replicated.replica_of_primary(primary)
    point_locks_at(bystander(replicated, primary))
    lock = new_lock(name, timeout=RENEWED_LEASE, auto_renew=True, fencing=True, reentrant=True)
    assert lock.acquire(wait=0)
    assert lock.acquire(wait=0)

    assert coordinated_failover(replicated, replica, slot) is primary

    assert held_on(replica, name) == lock.token
    # Redis confirmed a renewal more than a lease after the failover: on the new primary.
    renewed_after(lock, time.monotonic() + RENEWED_LEASE)
    assert not lock.lost
    assert lock.owned()
    assert 0 < replica.client.pttl(lock_keys(name, "default").lease) <= RENEWED_LEASE * 1000
    assert Lock(name, timeout=5).acquire(wait=0) is False
    fence = lock.fencing_token
    lock.release()
    assert lock.owned()  # one level of two left
    lock.release()
    assert not lock.locked()
    after = new_lock(name, timeout=5, fencing=True)
    assert after.acquire(wait=0)
    assert after.fencing_token > fence
    after.release()


def test_waiter_blocked_during_a_coordinated_failover_gets_the_lock(
    replicated, point_locks_at, new_lock, monkeypatch
):
    """A waiter blocked on its wake-up list on the old primary gets '-UNBLOCKED ... (master ->
    replica?)' when that primary turns replica: the wait counts as interrupted, the slot map is
    read again, and the waiter looks again, on the new primary. Its blocks last a minute (the
    holder's lease, its wait and BLOCK_CAP all longer): only a wake-up ends one sooner."""
    monkeypatch.setattr(flows, "BLOCK_CAP", 60.0)
    name = "failover:coordinated-waiter"
    keys = lock_keys(name, "default")
    slot = slot_of(name)
    primary = replicated.primary_of(slot)
    replica = replicated.replica_of_primary(primary)
    point_locks_at(bystander(replicated, primary))
    holder = new_lock(name, timeout=60, fencing=True)
    assert holder.acquire(wait=0)
    got: dict[str, Any] = {}

    def wait_for_it() -> None:
        waiter = Lock(name, timeout=10, fencing=True)
        try:
            got["acquired"] = waiter.acquire(wait=120)
            got["at"], got["fence"] = time.monotonic(), waiter.fencing_token
            if got["acquired"]:
                waiter.release()
        except BaseException as error:  # reported by the test below
            got["error"] = error

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    wait_until(lambda: primary.client.exists(keys.queue), what="the waiter to queue")
    wait_blocked(primary)

    coordinated_failover(replicated, replica, slot)

    fence = holder.fencing_token
    released_at = time.monotonic()
    holder.release()
    thread.join(60)
    assert not thread.is_alive()
    if "error" in got:
        raise known_bug(got["error"], "UNBLOCKED force unblock from blocking operation")
    assert got["acquired"] is True
    # Woken by the release, not by a later re-check (a minute on): a loaded machine gets a
    # woken thread going in far less than 30 s.
    assert got["at"] - released_at < 30
    assert got["fence"] > fence


def confirm_replicated(primary: Node, replica: Node, name: str) -> None:
    """Make sure the replica has every write the primary made so far, the lock's included:
    ``WAIT`` counts the replicas that have the writes of *its own* connection, so that
    connection writes something first (a key of the lock's slot, which this primary serves)."""
    probe = lock_keys(name, "default").lease + ":replicated"
    primary.client.set(probe, "1")
    assert primary.cmd("WAIT", 1, 1000) == 1
    replica.cmd("READONLY")
    assert replica.client.get(probe) == b"1"


def test_killed_primary_replaced_by_its_replica_keeps_a_replicated_lock(
    replicated, point_locks_at, new_lock
):
    """The primary is SIGKILLed after the lease reached its replica; the cluster promotes the
    replica (node timeout 1 s: about 2 s). Meanwhile lock calls fail with LockBackendError (the
    client does not wait out the failover); afterwards the same token holds the lock on the
    new primary, renewal resumes there, release works, and a waiter that retried its acquire
    after its LockBackendError gets the lock."""
    name = "failover:killed"
    keys = lock_keys(name, "default")
    slot = slot_of(name)
    primary = replicated.primary_of(slot)
    replica = replicated.replica_of_primary(primary)
    point_locks_at(bystander(replicated, primary))
    # A lease that outlasts the failover (30 s, renewed every 10 s): it must survive it.
    lock = new_lock(name, timeout=30, auto_renew=True, fencing=True)
    assert lock.acquire(wait=0)
    got: dict[str, Any] = {}
    waiter_errors = Retried()

    def wait_for_it() -> None:
        waiter = Lock(name, timeout=10, fencing=True)
        try:
            got["acquired"] = retry_backend_errors(
                lambda: waiter.acquire(wait=60), waiter_errors, what="the waiter"
            )
            got["at"], got["fence"] = time.monotonic(), waiter.fencing_token
            if got["acquired"]:
                waiter.release()
        except BaseException as error:  # reported by the test below
            got["error"] = error

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    wait_until(lambda: primary.client.exists(keys.queue), what="the waiter to queue")
    wait_blocked(primary)
    confirm_replicated(primary, replica, name)
    assert held_on(replica, name) == lock.token

    killed_at = time.monotonic()
    primary.server.kill()
    seen = Retried()
    assert retry_backend_errors(lock.owned, seen, what="owned()") is True

    promoted_after = time.monotonic() - killed_at
    wait_until(lambda: replicated.agreed_owner(slot) == replica.id, what="every node to agree")
    # The lease had at least 20 s left (promotion takes about 2 s: a loaded machine's
    # scheduling cannot make it 20).
    assert promoted_after < 20, promoted_after
    # Until then every call failed at once (the client's own retries all hit the dead node:
    # "ConnectionError: Error 111 connecting to ... Connection refused."), none hung.
    assert seen.errors, "a call to a dead primary cannot have succeeded"
    assert all(
        "ConnectionError" in str(error) or "CLUSTERDOWN" in str(error) for error in seen.errors
    ), {str(error) for error in seen.errors}
    # The blocked waiter's connection died with the primary: its next try failed at once, unless
    # the slot map this process shares had found the new primary by then (owned()'s retries, on
    # this thread, race it there: either way is right; a hang or another error is not).
    assert all("ConnectionError" in str(error) for error in waiter_errors.errors), {
        str(error) for error in waiter_errors.errors
    }
    assert held_on(replica, name) == lock.token
    # Renewal resumes on the new primary: Redis confirms one made after the promotion.
    renewed_after(lock, time.monotonic())
    assert not lock.lost
    fence, token = lock.fencing_token, lock.token
    released_at = time.monotonic()
    lock.release()
    assert not lock.owned()
    assert held_on(replica, name) != token  # free, or the waiter's already
    thread.join(60)
    assert not thread.is_alive()
    assert "error" not in got, got.get("error")
    assert got["acquired"] is True
    # The waiter's first entry in the queue (replicated, its owner gone) is skipped once its
    # liveness deadline passes: at most a block (2 s) and the slack (1 s), plus the lateness
    # of a blocking call's timeout on the server; not the end of the waiter's 60 s wait (a
    # loaded machine has the 17 s between the two).
    assert got["at"] - released_at < 20, got["at"] - released_at
    assert got["fence"] > fence


def test_killed_primary_loses_a_lease_its_replica_never_had(replicated, point_locks_at, new_lock):
    """What happens to a lease that was not replicated when the primary died: it is gone.

    Replication is asynchronous: the primary answers the acquisition before any replica has
    it. Here the replica is cut off (it cannot authenticate to the primary any more), so it
    certainly does not have it; in production the window is usually sub-millisecond, but a
    crash right after an acquisition, or a lagging replica, gives the same result. After the
    promotion the lock is free: a second holder takes it while the first still believes it
    holds it. The first learns it at its next renewal (``lost``), or at ``owned()`` /
    ``release()`` (``LockNotOwned``). Fencing tokens still increase (the new counter starts
    from the server clock), which is what protects the work. What closes most of the window
    is replica confirmation (``DJANGO_REDIS_LOCK_MIN_REPLICAS``, see docs/deployment.md); this
    test runs without it, as a plain Cluster client does by default."""
    name = "failover:unreplicated"
    slot = slot_of(name)
    primary = replicated.primary_of(slot)
    replica = replicated.replica_of_primary(primary)
    point_locks_at(bystander(replicated, primary))
    replica.cmd("CONFIG", "SET", "masteruser", "nobody")
    replica.cmd("CONFIG", "SET", "masterauth", "wrong")
    replica.cmd("CLIENT", "KILL", "TYPE", "master")
    wait_until(
        lambda: replica.client.info("replication")["master_link_status"] == "down",
        what="the replica to be cut off",
    )
    first = new_lock(name, timeout=5, auto_renew=True, fencing=True)
    assert first.acquire(wait=0)
    primary.client.set(lock_keys(name, "default").lease + ":replicated", "1")
    assert primary.cmd("WAIT", 1, 100) == 0
    assert held_on(replica, name) is None

    primary.server.kill()
    second = new_lock(name, timeout=5, fencing=True)
    assert retry_backend_errors(lambda: second.acquire(wait=0), Retried()) is True

    wait_until(lambda: replicated.agreed_owner(slot) == replica.id, what="every node to agree")
    assert held_on(replica, name) == second.token
    assert first.token is not None  # as far as this process knows, still held...
    assert not first.owned()  # ...but Redis says otherwise
    wait_until(lambda: first.lost, timeout=3, what="the renewal to notice")
    first_fence = first.fencing_token
    with pytest.raises(LockNotOwned):
        first.release()
    assert second.fencing_token > first_fence
    second.release()
