"""A Redis Cluster for the runtime simulation: the ``RedisCluster`` client the library is given
(``DJANGO_REDIS_LOCK_CONNECTION_FACTORY``, as a user gives one), and so the Cluster backend's
own code (``backends/cluster.py``) under the scheduler.

One client per schedule, made before it starts: redis-py reads the slot map as it makes one,
over real connections then. From there on its nodes' connections are the simulated network's
(``connection.py``) and its locks the scheduler's (``threads.SimulatedRLock``: redis-py holds
one while it reads the slot map again, after connection errors). The simulated processes share
it, as they share the other topologies' connection pools (each process's links its own).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

from redis.cluster import CommandsParser, NodesManager, RedisCluster

from .connection import SimulatedConnection
from .threads import SimulatedRLock

__all__ = ["SIMULATED", "factory", "prepare"]

# Whether this redis-py guards its slot map's reading again (redis-py 8: its
# ``_initialization_lock``). Before, two threads of one client reading it at once break each
# other's read ("dictionary changed size during iteration", redis-py's own race, which the
# simulation's crashes and cuts bring about): a Cluster is simulated on such versions only.
SIMULATED = "_initialization_lock" in NodesManager.__init__.__code__.co_names

_prepared: list[RedisCluster] = []


class _KnownCommands(CommandsParser):
    """redis-py's table of the server's commands, read (``COMMAND``) by the first client only:
    the same servers' table, which took half of each schedule's time to read and parse."""

    known: dict[str, Any] = {}

    def initialize(self, r: Any) -> None:
        if not _KnownCommands.known:
            super().initialize(r)
            _KnownCommands.known = self.commands
        self.commands = _KnownCommands.known


def prepare(world: Any, socket_timeout: float) -> RedisCluster:
    """This schedule's client of ``world``'s cluster (read by :func:`factory`)."""
    with mock.patch("redis.cluster.CommandsParser", _KnownCommands):
        cluster = RedisCluster.from_url(
            world.home().url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
    manager = cluster.nodes_manager
    manager.connection_kwargs["connection_class"] = SimulatedConnection  # (nodes found later)
    for node in manager.nodes_cache.values():
        pool = node.redis_connection.connection_pool
        pool.disconnect()
        pool.reset()
        pool.connection_class = SimulatedConnection
    cluster._lock = SimulatedRLock()  # (redis-py's own locks, made real when it was made)
    manager._lock = SimulatedRLock()
    manager._initialization_lock = SimulatedRLock()
    _prepared[:] = [cluster]
    return cluster


def factory(alias: str) -> RedisCluster:
    """``DJANGO_REDIS_LOCK_CONNECTION_FACTORY``: the client :func:`prepare` made."""
    return _prepared[0]
