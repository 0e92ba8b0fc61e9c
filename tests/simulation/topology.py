"""The topologies a schedule runs on, each a set of real servers and the backend (``backends/``)
the flows' requests go through, as the library picks it for that topology:

- ``server``: one redis-server, :class:`~django_redis_lock.backends.ServerBackend`;
- ``quorum``: three independent servers held as a majority (Redlock),
  :class:`~django_redis_lock.backends.QuorumBackend` on a
  :class:`~django_redis_lock.quorum.QuorumClient`; a fault makes one member unreachable (down,
  or partitioned away: its connections fail at once) and reachable again, or restarts one
  empty. No queue: waiters poll. (Each request reaches the members in one step: the order in
  which two clients' requests reach different members is not explored.)
- ``cluster``: a Redis Cluster of three primaries,
  :class:`~django_redis_lock.backends.ClusterBackend` on redis-py's ``RedisCluster``; the
  simulation's keys share one hash tag, so one slot, which a fault may move to another node key
  by key (``MIGRATING`` / ``IMPORTING``, ``MIGRATE``, then ``SETSLOT NODE``), with requests
  coming in between: redis-py follows ``ASK`` and ``MOVED``, and a script whose keys are split
  between the nodes gets ``TRYAGAIN``.

A world observes (``server.OBSERVE``) every node that may hold the slot's keys, and merges
what they say.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import redis
import redis.cluster
import redis.connection
from redis.cluster import RedisCluster
from redis.crc import key_slot

from django_redis_lock.backends import ClusterBackend, QuorumBackend, ServerBackend
from django_redis_lock.quorum import QuorumClient
from django_redis_lock.scripts import Script
from embedded_redis import EmbeddedRedis, start_cluster

from .server import CLOCK_PREFIX, NAMESPACE, Observed, SimulatedServer, simulated_scripts

__all__ = [
    "TAG",
    "TOPOLOGIES",
    "UNSUPPORTED",
    "ClusterWorld",
    "QuorumWorld",
    "ServerWorld",
    "World",
    "combinations",
    "simulated_topology",
]

TOPOLOGIES = ("server", "cluster", "quorum")
# The workloads a topology does not run: quorum mode has no semaphores.
UNSUPPORTED = {"quorum": ("semaphore",)}
# Every key of a schedule carries this hash tag: one Redis Cluster slot.
TAG = "{sim}"


class World:
    """What a topology gives the simulation."""

    name = ""
    backend: Any
    scripts: dict[str, Script]
    nodes: list[SimulatedServer]
    faults: tuple[str, ...] = ()

    def reset(self, now_us: int) -> None:
        """Empty every node for a new schedule; the scripts' clock at ``now_us`` (kept an hour:
        no key is left without an expiry)."""
        for node in self.nodes:
            node.reset()
        self.home().client.set(CLOCK_PREFIX + TAG, now_us, px=3_600_000)

    def home(self) -> SimulatedServer:
        return self.nodes[0]

    def watched(self) -> list[SimulatedServer]:
        """The nodes that may hold keys of the schedule now."""
        return [self.home()]

    def observe(self, now_us: int, moved_ms: int, pops: list[str]) -> Observed:
        merged: Observed | None = None
        for node in self.watched():
            observed = node.observe(now_us, moved_ms, pops)
            if merged is None:
                merged = observed
                continue
            merged.keys.update(observed.keys)
            merged.expired += observed.expired
            merged.popped = [
                a if a is not None else b
                for a, b in zip(merged.popped, observed.popped, strict=True)
            ]
        assert merged is not None
        return merged

    def snapshot(self) -> dict[str, bytes]:
        return self.home().snapshot()

    def restart(self, snapshot: dict[str, tuple[bytes, int]] | None) -> None:
        for node in self.watched():
            node.restart(snapshot if node is self.home() else None)

    def fault(self, kind: str, choices: Any) -> tuple[str, bool]:
        """Carry out one step of fault ``kind``: what happened, and whether data was lost."""
        raise NotImplementedError(kind)

    def under_way(self) -> str | None:
        """A fault of several steps that has begun (its next step is due soon), or None."""
        return None

    @contextlib.contextmanager
    def carrying(self) -> Iterator[None]:
        """Around each request the backend carries out."""
        yield

    def stop(self) -> None:
        for node in self.nodes:
            node.close()


class ServerWorld(World):
    name = "server"

    def __init__(self, url: str, scripts: dict[str, Script] | None = None) -> None:
        self.scripts = scripts if scripts is not None else simulated_scripts()
        self.nodes = [SimulatedServer(url, self.scripts)]
        self.backend = ServerBackend(self.nodes[0].client)
        self._processes: list[EmbeddedRedis] = []

    def stop(self) -> None:
        super().stop()
        for process in self._processes:
            process.stop()


class ClusterWorld(World):
    name = "cluster"
    faults = ("migrate",)

    def __init__(self, urls: list[str], scripts: dict[str, Script] | None = None) -> None:
        self.scripts = scripts if scripts is not None else simulated_scripts()
        self.nodes = [SimulatedServer(url, self.scripts) for url in urls]
        self.cluster = RedisCluster.from_url(urls[0])
        self.backend = ClusterBackend(self.cluster)
        self.slot = key_slot(TAG.encode())
        self._processes: list[EmbeddedRedis] = []
        self._ids = {node: _node_id(node.client) for node in self.nodes}
        self._home = next(n for n in self.nodes if _slot_owner(n.client, self.slot))
        self._target: SimulatedServer | None = None  # the slot is moving there

    def home(self) -> SimulatedServer:
        return self._home

    def watched(self) -> list[SimulatedServer]:
        return [self._home] + ([self._target] if self._target is not None else [])

    def reset(self, now_us: int) -> None:
        if self._target is not None:
            self._finish_move()
        super().reset(now_us)

    @contextlib.contextmanager
    def carrying(self) -> Iterator[None]:
        # redis-py's Cluster client sleeps (real time) before it retries a TRYAGAIN or after a
        # CLUSTERDOWN; in the simulation no time passes there, so it retries at once.
        cluster_time = redis.cluster.time
        redis.cluster.time = _NO_SLEEP  # type: ignore[assignment]
        try:
            yield
        finally:
            redis.cluster.time = cluster_time

    def under_way(self) -> str | None:
        return "migrate" if self._target is not None else None

    def snapshot(self) -> dict[str, bytes]:
        if self._target is not None:  # (a slot being moved ends its move first)
            self._finish_move()
        return super().snapshot()

    def restart(self, snapshot: dict[str, tuple[bytes, int]] | None) -> None:
        if self._target is not None:
            self._finish_move()
        super().restart(snapshot)

    def fault(self, kind: str, choices: Any) -> tuple[str, bool]:
        """One step of moving the slot: start, move one key, or finish."""
        if self._target is None:
            self._target = choices.pick([n for n in self.nodes if n is not self._home])
            source, target = self._home, self._target
            _cluster(target, "SETSLOT", self.slot, "IMPORTING", self._ids[source])
            _cluster(source, "SETSLOT", self.slot, "MIGRATING", self._ids[target])
            # The scripts read the clock of the slot on whichever node they run.
            target.asking = True
            clock = source.client.get(CLOCK_PREFIX + TAG)
            asking = target.client.pipeline(transaction=False)
            asking.execute_command("ASKING").set(CLOCK_PREFIX + TAG, clock, px=3_600_000)
            asking.execute()
            return f"slot MIGRATING from {self._name(source)} to {self._name(target)}", False
        keys = self._home.client.keys(NAMESPACE + "*")
        if keys and choices.chance(70):
            key = choices.pick(sorted(keys))
            self._migrate([key])
            return f"key {key.decode()} MIGRATED", False
        self._finish_move()
        return "slot moved: SETSLOT NODE", False

    def _finish_move(self) -> None:
        source, target = self._home, self._target
        assert target is not None
        self._migrate(source.client.keys(NAMESPACE + "*") + source.client.keys(CLOCK_PREFIX + "*"))
        # The target first, then the source, then the rest (Redis Cluster's order), and the
        # target's config epoch made the highest: no older claim gossiped later wins.
        for node in [target, source] + [n for n in self.nodes if n not in (source, target)]:
            _cluster(node, "SETSLOT", self.slot, "NODE", self._ids[target])
        _cluster(target, "BUMPEPOCH")
        self._settle(target)
        target.asking = False
        self._home, self._target = target, None

    def _settle(self, owner: SimulatedServer, timeout: float = 10.0) -> None:
        """Until every node says ``owner`` has the slot (gossip has no event to wait on: a
        bounded probe, which tells a node that says otherwise again)."""
        deadline = time.monotonic() + timeout
        while True:
            wrong = [
                n for n in self.nodes if _slot_owner_id(n.client, self.slot) != self._ids[owner]
            ]
            if not wrong:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster does not agree who has slot {self.slot}")
            _cluster(owner, "BUMPEPOCH")
            for node in wrong:
                _cluster(node, "SETSLOT", self.slot, "NODE", self._ids[owner])
            time.sleep(0.01)

    def _migrate(self, keys: list[bytes]) -> None:
        if not keys:
            return
        target = self._target
        assert target is not None
        address = target.client.connection_pool.connection_kwargs
        self._home.client.execute_command(
            "MIGRATE", address["host"], address["port"], "", 0, 5000, "REPLACE", "KEYS", *keys
        )

    def _name(self, node: SimulatedServer) -> str:
        return f"node {self.nodes.index(node) + 1}"

    def stop(self) -> None:
        super().stop()
        self.cluster.close()
        for process in self._processes:
            process.stop()


class _NoSleep:
    """``time`` for redis-py's Cluster client, without sleeping."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        """(No time passes.)"""


_NO_SLEEP = _NoSleep()


class _Reachable(redis.connection.Connection):
    """A member's connection, which fails at once while the simulation has its server
    unreachable (down, or on the far side of a partition)."""

    unreachable: set[int] = set()  # ports, set by QuorumWorld

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self.port in self.unreachable:
            self.disconnect()
            raise redis.ConnectionError("simulated: the server cannot be reached")
        super().send_packed_command(command, check_health)


class QuorumWorld(World):
    name = "quorum"
    faults = ("unreachable", "member restart")

    def __init__(self, urls: list[str], scripts: dict[str, Script] | None = None) -> None:
        self.scripts = scripts if scripts is not None else simulated_scripts()
        self.nodes = [SimulatedServer(url, self.scripts) for url in urls]  # (always reachable)
        self.members = [redis.Redis.from_url(url, connection_class=_Reachable) for url in urls]
        self.client = QuorumClient(
            "simulated", [(f"member{i + 1}", m) for i, m in enumerate(self.members)], self.scripts
        )
        self.backend = QuorumBackend(self.client)
        self.majority = len(urls) // 2 + 1
        self._processes: list[EmbeddedRedis] = []

    def _port(self, node: SimulatedServer) -> int:
        return int(node.client.connection_pool.connection_kwargs["port"])

    def reset(self, now_us: int) -> None:
        _Reachable.unreachable.clear()
        for node in self.nodes:
            node.reset()
            node.client.set(CLOCK_PREFIX + TAG, now_us, px=3_600_000)

    def watched(self) -> list[SimulatedServer]:
        return self.nodes

    def observe(self, now_us: int, moved_ms: int, pops: list[str]) -> Observed:
        """What a majority of the members hold (a key without an expiry on any one shows)."""
        each = [node.observe(now_us, moved_ms, pops) for node in self.nodes]
        merged = Observed(popped=[None] * len(pops))
        for key in sorted({key for observed in each for key in observed.keys}):
            states = [observed.keys[key] for observed in each if key in observed.keys]
            lasting = [state for state in states if state.pttl == -1]
            values = [repr(state.value) for state in states]
            common = max(set(values), key=values.count)
            if lasting:
                merged.keys[key] = lasting[0]
            elif values.count(common) >= self.majority:
                merged.keys[key] = states[values.index(common)]
        merged.expired = sorted({key for observed in each for key in observed.expired})
        return merged

    def snapshot(self) -> dict[str, bytes]:
        return self.nodes[0].snapshot()

    def restart(self, snapshot: dict[str, tuple[bytes, int]] | None) -> None:
        """The first member restarts (the others are its peers' concern: ``member restart``)."""
        self.nodes[0].restart(snapshot)

    def fault(self, kind: str, choices: Any) -> tuple[str, bool]:
        node = choices.pick(self.nodes)
        number = self.nodes.index(node) + 1
        if kind == "member restart":
            node.restart(None)
            return f"member {number} restarts empty", True
        port = self._port(node)
        if port in _Reachable.unreachable:
            _Reachable.unreachable.discard(port)
            return f"member {number} reachable again", False
        if len(_Reachable.unreachable) + 1 < self.majority:  # (a majority stays reachable)
            _Reachable.unreachable.add(port)
            return f"member {number} unreachable", False
        return "(no member can go: a majority must stay)", False

    def stop(self) -> None:
        super().stop()
        for member in self.members:
            member.close()
        for process in self._processes:
            process.stop()


def _cluster(node: SimulatedServer, *args: Any) -> Any:
    return node.client.execute_command("CLUSTER", *args)


def _node_id(client: redis.Redis) -> str:
    return client.execute_command("CLUSTER", "MYID").decode()


def _slot_owner(client: redis.Redis, slot: int) -> bool:
    return _slot_owner_id(client, slot) == _node_id(client)


def _slot_owner_id(client: redis.Redis, slot: int) -> str | None:
    """Who has ``slot``, as the node of ``client`` sees it."""
    for line in client.execute_command("CLUSTER", "NODES").decode().splitlines():
        fields = line.split()
        for part in fields[8:]:
            first, _, last = part.partition("-")
            if first.isdigit() and int(first) <= slot <= int(last or first):
                return fields[0]
    return None


def combinations(workloads: tuple[str, ...]) -> list[tuple[str, str]]:
    """Every (topology, workload) that runs."""
    return [(t, w) for t in TOPOLOGIES for w in workloads if w not in UNSUPPORTED.get(t, ())]


def simulated_topology(
    name: str, directory: str, scripts: dict[str, Script] | None = None
) -> World:
    """Start ``name``'s servers under ``directory`` (stopped by ``world.stop()``)."""
    if name == "server":
        process = EmbeddedRedis(directory=directory).start()
        world: World = ServerWorld(process.url, scripts)
        world._processes.append(process)  # type: ignore[attr-defined]
        return world
    if name == "quorum":
        processes = [
            EmbeddedRedis(directory=os.path.join(directory, f"member{i}")).start()
            for i in range(3)
        ]
        world = QuorumWorld([process.url for process in processes], scripts)
        world._processes = processes  # type: ignore[attr-defined]
        return world
    processes = []
    counter = iter(range(100))

    def start(**kwargs: Any) -> EmbeddedRedis:
        node_directory = os.path.join(directory, f"node{next(counter)}")
        os.makedirs(node_directory, exist_ok=True)
        process = EmbeddedRedis(directory=node_directory, **kwargs).start()
        processes.append(process)
        return process

    start_cluster(3, start=start)
    world = ClusterWorld([process.url for process in processes], scripts)
    world._processes = processes  # type: ignore[attr-defined]
    return world
