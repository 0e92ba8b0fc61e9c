"""A deterministic simulator of the lock protocol (the approach of FoundationDB's simulation and
TigerBeetle's VOPR): many simulated clients run the engine's own flows (``core/``) against a
real redis-server, with the real scripts, one request at a time, in an order decided by a
seeded random source or by Hypothesis; time is simulated; faults are scheduled events; and the
invariants are checked after every step. See ``simulation.py`` for a step, ``ledger.py`` for
the invariants, ``workloads.py`` for the clients, ``__main__.py`` for ``make simulate``.

``runtime/`` runs the library's own code (``Lock``, ``Semaphore``, ``lock_many`` as users call
them) under the same kind of scheduler, with the same ledger, worlds and mutations.
"""

from __future__ import annotations

import random

from .choices import Choices, HypothesisChoices, SeededChoices
from .cluster import ClusterSplit, ClusterWorld
from .quorum import QuorumWorld
from .server import SimulatedServer, simulated_scripts
from .simulation import FAULTS_ON, NO_FAULTS, Faults, Simulation, SimulationFailed
from .topology import TOPOLOGIES, combinations, simulated_topology
from .workloads import WORKLOADS, cast
from .world import ServerWorld, Stalled, World, WorldFault

__all__ = [
    "FAULTS_ON",
    "TOPOLOGIES",
    "WORKLOADS",
    "ClusterSplit",
    "ClusterWorld",
    "Faults",
    "HypothesisChoices",
    "QuorumWorld",
    "SeededChoices",
    "ServerWorld",
    "SimulatedServer",
    "Simulation",
    "SimulationFailed",
    "Stalled",
    "World",
    "WorldFault",
    "combinations",
    "run_schedule",
    "simulated_scripts",
    "simulated_topology",
]


def run_schedule(
    world: World, workload: str, choices: Choices, faults: Faults = NO_FAULTS
) -> Simulation:
    """One schedule of ``workload`` on ``world``; raises :class:`SimulationFailed` with its
    trace."""
    if isinstance(choices, SeededChoices):
        random.seed(choices.seed)  # the flows' own random delays (Hypothesis seeds its own)
    simulation = Simulation(world, choices, faults)
    cast(simulation, workload, choices)
    simulation.run()
    return simulation
