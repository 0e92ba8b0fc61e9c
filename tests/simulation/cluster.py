"""A Redis Cluster of three primaries in the simulation: :class:`ClusterWorld`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import redis
import redis.cluster
from redis.cluster import RedisCluster
from redis.connection import Connection
from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, ResponseError

from django_redis_lock.backends import ClusterBackend
from django_redis_lock.backends.scripts import Script

from .server import CLOCK_PREFIX, NAMESPACE, Observed, SimulatedServer, simulated_scripts
from .world import TAG, World, WorldFault

__all__ = ["ClusterSplit", "ClusterWorld"]

# A key in the schedule's slot that never exists: asked of every node after each step, it
# tells who each node says has the slot (see ClusterWorld.observe).
PROBE = NAMESPACE + TAG + ":probe"


class ClusterSplit(WorldFault):
    """Two nodes acted as the owner of the schedule's slot (or one named a third): Redis
    Cluster's gossip brought an older claim back after every node had agreed. Then two
    primaries accept writes to one key, and no lock on Redis Cluster holds, ours or any: it is
    the cluster's split brain, not the protocol's fault (a ``WorldFault``)."""


class ClusterWorld(World):
    name = "cluster"

    def __init__(
        self, urls: list[str], scripts: dict[str, Script] | None = None, moves: bool = True,
        clocks: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        """``moves``: whether a fault may move the slot. (Not in the suite: after a move, Redis
        Cluster's gossip has been seen, about once in 40,000 schedules, to leave two nodes
        claiming the slot, which fails the simulation itself. ``make simulate`` moves it.)
        ``clocks``: hash tags besides the schedule's whose scripts run too (the guards'
        budget of kept responses, ``{!replay-budget}``): each gets a clock, on the node of
        its slot, and that node is watched as well."""
        self.faults = ("migrate",) if moves else ()
        self.scripts = scripts if scripts is not None else simulated_scripts()
        self.nodes = [SimulatedServer(url, self.scripts) for url in urls]
        self.cluster = RedisCluster.from_url(urls[0])
        self.backend = ClusterBackend(self.cluster)
        self.slot = key_slot(TAG.encode())
        self.processes = []
        self._ids = {node: _node_id(node.client) for node in self.nodes}
        # A second connection to each node, for the ownership probe sent beside the
        # observation (each node answers both at once).
        self._probes = {node: Connection(**node.client.connection_pool.connection_kwargs)
                        for node in self.nodes}  # fmt: skip
        self._home = next(n for n in self.nodes if _slot_owner(n.client, self.slot))
        self.clocks = clocks
        self._clock_nodes = [
            next(n for n in self.nodes if _slot_owner(n.client, key_slot(tag.encode())))
            for tag in clocks
        ]  # fmt: skip
        self._target: SimulatedServer | None = None  # the slot is moving there
        self._moved = False  # this schedule's slot has moved (once is all a schedule sees)

    def home(self) -> SimulatedServer:
        return self._home

    def watched(self) -> list[SimulatedServer]:
        nodes = [self._home] + ([self._target] if self._target is not None else [])
        return nodes + [node for node in dict.fromkeys(self._clock_nodes) if node not in nodes]

    def reset(self, now_us: int) -> None:
        if self._target is not None:
            self._finish_move()
        # (Gossip has been seen to hand a moved slot back to an older claim some time after
        # every node agreed: each schedule starts with every node agreeing again.)
        self._settle(self._home)
        self._moved = False
        super().reset(now_us)
        for tag in self.clocks:
            self.cluster.set(CLOCK_PREFIX + tag, now_us, px=3_600_000)

    def observe(self, now_us: int, moved_ms: int, pops: list[str]) -> Observed:
        """The nodes' observation, and a probe of who has the slot, asked of every node: the
        home answers for it (or, while the slot is being moved, sends the probe's missing key
        on with ASK), every other node redirects to the home with MOVED. Anything else is a
        :class:`ClusterSplit`, raised before the step's outcome is judged."""
        for node in self.nodes:
            self._probes[node].send_command("EXISTS", PROBE)
        observed = super().observe(now_us, moved_ms, pops)
        home = self._address(self._home)
        claims = []
        for node in self.nodes:
            try:
                self._probes[node].read_response()
                says = self._address(node)
            except ResponseError as error:
                says = self._redirected_to(error, node)
            if says != home:
                claims.append(f"{self._name(node)} says {says}")
        if claims:
            raise ClusterSplit(f"the slot is {self._name(self._home)}'s ({home}), but "
                               + "; ".join(claims))  # fmt: skip
        return observed

    def _redirected_to(self, error: ResponseError, node: SimulatedServer) -> str:
        """Who ``node`` says has the slot, by the redirection it answered the probe with
        (redis-py 8 raises ``MovedError`` and ``AskError``; older versions, on a plain
        connection, a ``ResponseError`` saying ``MOVED <slot> <host:port>``)."""
        if isinstance(error, MovedError):
            return f"{error.host}:{error.port}"
        words = str(error).split()
        if isinstance(error, AskError) or words[:1] == ["ASK"]:
            home = self._address(self._home)
            return home if node is self._home else "ASK from a node that is not the home"
        if words[:1] == ["MOVED"] and len(words) == 3:
            return words[2]
        raise error

    def _address(self, node: SimulatedServer) -> str:
        address = node.client.connection_pool.connection_kwargs
        return f"{address['host']}:{address['port']}"

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
        """One step of moving the slot: start, move one key, or finish. (A slot moved back
        and forth within milliseconds has been seen to end up claimed by two nodes, gossip
        bringing an older claim back: a resharding moves it once.)"""
        if self._target is None and self._moved:
            return "(the slot has moved already)", False
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
        self._home, self._target, self._moved = target, None, True

    def _settle(self, owner: SimulatedServer, timeout: float = 10.0) -> None:
        """Until every node says ``owner`` has the slot, and knows the owner's latest config
        epoch (a node that knew an older one could still take an older claim, gossiped late,
        for the newer: the split :class:`ClusterSplit` is about). Gossip has no event to wait
        on: a bounded probe, which tells a node that says otherwise again."""
        deadline = time.monotonic() + timeout
        while True:
            epoch = _epochs(owner.client)[self._ids[owner]]
            wrong = [
                n for n in self.nodes
                if _slot_owner_id(n.client, self.slot) != self._ids[owner]
                or _epochs(n.client).get(self._ids[owner]) != epoch
            ]  # fmt: skip
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
        for connection in self._probes.values():
            connection.disconnect()
        self.cluster.close()


class _NoSleep:
    """``time`` for redis-py's Cluster client, without sleeping."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        """(No time passes.)"""


_NO_SLEEP = _NoSleep()


def _cluster(node: SimulatedServer, *args: Any) -> Any:
    return node.client.execute_command("CLUSTER", *args)


def _node_id(client: redis.Redis) -> str:
    return client.execute_command("CLUSTER", "MYID").decode()


def _slot_owner(client: redis.Redis, slot: int) -> bool:
    return _slot_owner_id(client, slot) == _node_id(client)


def _epochs(client: redis.Redis) -> dict[str, str]:
    """Each node's config epoch, as the node of ``client`` knows it."""
    lines = client.execute_command("CLUSTER", "NODES").decode().splitlines()
    return {fields[0]: fields[6] for fields in (line.split() for line in lines)}


def _slot_owner_id(client: redis.Redis, slot: int) -> str | None:
    """Who has ``slot``, as the node of ``client`` sees it."""
    for line in client.execute_command("CLUSTER", "NODES").decode().splitlines():
        fields = line.split()
        for part in fields[8:]:
            first, _, last = part.partition("-")
            if first.isdigit() and int(first) <= slot <= int(last or first):
                return fields[0]
    return None
