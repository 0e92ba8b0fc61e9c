"""The topologies a schedule runs on, each a set of real servers and the backend (``backends/``)
the flows' requests go through, as the library picks it for that topology:

- ``server``: one redis-server, :class:`~django_redis_lock.backends.ServerBackend`;
- ``quorum``: three independent servers held as a majority (Redlock),
  :class:`~django_redis_lock.backends.QuorumBackend` on a
  :class:`~django_redis_lock.backends.quorum.QuorumClient`; a fault makes one member
  unreachable (down, or partitioned away: its connections fail at once) and reachable again,
  or restarts one empty. No queue: waiters poll. (Each request reaches the members in one
  step: the order in which two clients' requests reach different members is not explored.)
- ``cluster``: a Redis Cluster of three primaries,
  :class:`~django_redis_lock.backends.ClusterBackend` on redis-py's ``RedisCluster``; the
  simulation's keys share one hash tag, so one slot, which a fault may move to another node key
  by key (``MIGRATING`` / ``IMPORTING``, ``MIGRATE``, then ``SETSLOT NODE``), with requests
  coming in between: redis-py follows ``ASK`` and ``MOVED``, and a script whose keys are split
  between the nodes gets ``TRYAGAIN``.
"""

from __future__ import annotations

import os
from typing import Any

from dev.embedded_redis import EmbeddedRedis, start_cluster
from django_redis_lock.backends.scripts import Script

from .cluster import ClusterWorld
from .quorum import QuorumWorld
from .world import ServerWorld, World

__all__ = ["TOPOLOGIES", "UNSUPPORTED", "combinations", "simulated_topology"]

TOPOLOGIES = ("server", "cluster", "quorum")
# The workloads a topology does not run: quorum mode has no semaphores.
UNSUPPORTED = {"quorum": ("semaphore",)}


def combinations(workloads: tuple[str, ...]) -> list[tuple[str, str]]:
    """Every (topology, workload) that runs."""
    return [(t, w) for t in TOPOLOGIES for w in workloads if w not in UNSUPPORTED.get(t, ())]


def simulated_topology(
    name: str, directory: str, scripts: dict[str, Script] | None = None, **options: Any
) -> World:
    """Start ``name``'s servers under ``directory`` (stopped by ``world.stop()``);
    ``options`` go to the world (``ClusterWorld``'s ``moves``)."""
    if name == "server":
        process = EmbeddedRedis(directory=directory).start()
        world: World = ServerWorld(process.url, scripts)
        world.processes.append(process)
        return world
    if name == "quorum":
        members = [
            EmbeddedRedis(directory=os.path.join(directory, f"member{i}")).start()
            for i in range(3)
        ]
        world = QuorumWorld([member.url for member in members], scripts)
        world.processes = members
        return world
    processes: list[EmbeddedRedis] = []
    counter = iter(range(100))

    def start(**kwargs: Any) -> EmbeddedRedis:
        node_directory = os.path.join(directory, f"node{next(counter)}")
        os.makedirs(node_directory, exist_ok=True)
        process = EmbeddedRedis(directory=node_directory, **kwargs).start()
        processes.append(process)
        return process

    start_cluster(3, start=start)
    world = ClusterWorld([process.url for process in processes], scripts, **options)
    world.processes = processes
    return world
