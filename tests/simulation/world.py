"""What a topology gives the simulation (``topology.py`` names them): its servers, the backend
(``backends/``) the flows' requests go through, as the library picks it for that topology,
and its own faults. A world observes (``server.OBSERVE``) every node that may hold the
schedule's keys, and merges what they say."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from dev.embedded_redis import EmbeddedRedis
from django_redis_lock.backends import ServerBackend
from django_redis_lock.backends.scripts import Script

from .server import CLOCK_PREFIX, Observed, SimulatedServer, simulated_scripts

__all__ = ["TAG", "ServerWorld", "Snapshot", "Stalled", "World", "WorldFault", "aged", "taken"]

# Every key of a schedule carries this hash tag: one Redis Cluster slot.
TAG = "{sim}"


# The servers' data when a "snapshot" fault took it: (when, key -> (dump, ms it had left)).
Snapshot = tuple[int, dict[str, tuple[bytes, int]]]


def taken(world: World, observed: Any, now_us: int) -> Snapshot:
    """A snapshot of ``world`` now, each key with the time it had left (``observed``: the
    ledger's last observation)."""
    state = observed.keys
    dumps = world.snapshot()
    return now_us, {key: (dump, state[key].pttl) for key, dump in dumps.items() if key in state}


def aged(snapshot: Snapshot, now_us: int) -> dict[str, tuple[bytes, int]]:
    """What a restart from ``snapshot`` brings back now: each key with what it has left, those
    whose time ran out since gone."""
    taken_us, kept = snapshot
    passed = (now_us - taken_us) // 1000
    return {key: (dump, ms - passed) for key, (dump, ms) in kept.items() if ms - passed > 0}


class WorldFault(Exception):
    """The world, not the protocol, broke a schedule (its servers did what no schedule asked
    for): the schedule says nothing about the protocol, and ``make simulate`` runs it again on
    a world set right."""


class Stalled(WorldFault):
    """A server expired a key by its own clock during a schedule that then failed: real time
    ran on while the simulation stood still (the machine paused or starved it: SIGSTOP, a
    swap storm) for long enough to eat into a lease. Expiries run ``SCALE`` times slower than
    simulated time, and the simulation gives every key its simulated time left at each step;
    a key that expires in between was cut short by the stall, not by any client."""


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

    def node_at(self, host: str, port: int) -> SimulatedServer:
        """The node a client's connection to ``host:port`` reaches (``runtime/network.py``)."""
        for node in self.nodes:
            kwargs = node.client.connection_pool.connection_kwargs
            if int(kwargs.get("port", 6379)) == int(port):
                return node
        raise LookupError(f"no node of {self.name} at {host}:{port}")

    def expirations(self) -> int:
        """The keys the servers have expired by their own clocks so far (``INFO stats``):
        none of a schedule's should be (see :class:`Stalled`)."""
        return sum(int(node.client.info("stats")["expired_keys"]) for node in self.nodes)

    def watched(self) -> list[SimulatedServer]:
        """The nodes that may hold keys of the schedule now."""
        return [self.home()]

    def observe(self, now_us: int, moved_ms: int, pops: list[str]) -> Observed:
        watched = self.watched()
        for node in watched:
            node.send_observe(now_us, moved_ms, pops)
        merged: Observed | None = None
        for node in watched:
            observed = node.read_observe()
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

    def restartable(self) -> bool:
        """Whether a restart of the servers may happen now (``Simulation``'s "restart")."""
        return True

    def under_way(self) -> str | None:
        """A fault of several steps that has begun (its next step is due soon), or None."""
        return None

    @contextlib.contextmanager
    def carrying(self) -> Iterator[None]:
        """Around each request the backend carries out."""
        yield

    # The servers started for it (``topology.simulated_topology``), stopped with it.
    processes: list[EmbeddedRedis]

    def stop(self) -> None:
        for node in self.nodes:
            node.close()
        for process in self.processes:
            process.stop()


class ServerWorld(World):
    name = "server"

    def __init__(self, url: str, scripts: dict[str, Script] | None = None) -> None:
        self.scripts = scripts if scripts is not None else simulated_scripts()
        self.nodes = [SimulatedServer(url, self.scripts)]
        self.backend = ServerBackend(self.nodes[0].client)
        self.processes = []
