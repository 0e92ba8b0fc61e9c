"""Three independent servers held as a majority in the simulation: :class:`QuorumWorld`."""

from __future__ import annotations

from typing import Any

import redis
import redis.connection

from django_redis_lock.backends import QuorumBackend
from django_redis_lock.backends.quorum import QuorumClient
from django_redis_lock.backends.scripts import Script

from .server import CLOCK_PREFIX, Observed, SimulatedServer, simulated_scripts
from .world import TAG, World

__all__ = ["QuorumWorld"]


class _Reachable(redis.connection.Connection):
    """A member's connection, which fails at once while the simulation has its server
    unreachable (down, or on the far side of a partition)."""

    unreachable: set[int] = set()  # ports, set by QuorumWorld

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self.port in self.unreachable:
            self.disconnect()
            raise redis.ConnectionError("simulated: the server cannot be reached")
        super().send_packed_command(command, check_health)


# The longest lease a schedule's client takes (workloads.py): a member restarted empty keeps
# out of the quorum's way until then, as Redlock's rule asks (docs/quorum.md).
LONGEST_LEASE_US = 10_000_000


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
        self.processes = []
        self._now_us = 0
        self._restarted: dict[int, int] = {}  # member index -> when it last restarted empty

    def _port(self, node: SimulatedServer) -> int:
        return int(node.client.connection_pool.connection_kwargs["port"])

    def reset(self, now_us: int) -> None:
        _Reachable.unreachable.clear()
        self._now_us, self._restarted = now_us, {}
        for node in self.nodes:
            node.reset()
            node.client.set(CLOCK_PREFIX + TAG, now_us, px=3_600_000)

    def watched(self) -> list[SimulatedServer]:
        return self.nodes

    def observe(self, now_us: int, moved_ms: int, pops: list[str]) -> Observed:
        """What a majority of the members hold (a key without an expiry on any one shows)."""
        self._now_us = now_us
        for node in self.nodes:
            node.send_observe(now_us, moved_ms, pops)
        each = [node.read_observe() for node in self.nodes]
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

    def restartable(self) -> bool:
        return self._may_restart(0)

    def _may_restart(self, index: int) -> bool:
        """Redlock's rule (docs/quorum.md): a member that lost its data stays out until the
        longest lease has passed, so no other member loses its data within that time: two of
        three losing theirs at once is a majority forgetting a holder, which no quorum lock
        survives."""
        return not any(
            other != index and self._now_us - at < LONGEST_LEASE_US
            for other, at in self._restarted.items()
        )

    def restart(self, snapshot: dict[str, tuple[bytes, int]] | None) -> None:
        """The first member restarts (the others are its peers' concern: ``member restart``)."""
        self.nodes[0].restart(snapshot)
        self._restarted[0] = self._now_us

    def fault(self, kind: str, choices: Any) -> tuple[str, bool]:
        node = choices.pick(self.nodes)
        number = self.nodes.index(node) + 1
        if kind == "member restart":
            if not self._may_restart(number - 1):
                return f"(member {number} stays up: another restarted within a lease)", False
            node.restart(None)
            self._restarted[number - 1] = self._now_us
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
