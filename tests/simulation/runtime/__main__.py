"""``python -m tests.simulation.runtime``: schedules of the library's own code, in this process
(it takes the process over: ``threads.py``), on a private redis-server of its own.

    python -m tests.simulation.runtime share                  # the suite's share (CI)
    python -m tests.simulation.runtime mutants                # the share finds each mutation
    python -m tests.simulation.runtime campaign --schedules 100000 --workload lock
    python -m tests.simulation.runtime replay --seed 4711 --workload semaphore
    python -m tests.simulation.runtime replay --seed 28 --workload lock --topology quorum

Exit status 1 when a schedule failed (``share``, ``campaign``), a mutation went unnoticed
(``mutants``), or a replayed schedule failed (``replay``, which prints its trace).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import logging
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from ..choices import SeededChoices
from ..mutations import CODE_MUTATIONS, MUTATIONS, mutated_code, patch_for
from ..simulation import FAULTS_ON, NO_FAULTS, SimulationFailed
from ..topology import simulated_topology
from ..world import World, WorldFault
from . import WORKLOADS, cluster, run_runtime_schedule
from .guarded import REPLAY_BUDGET_TAG

# The topologies the runtime simulation runs on, and the workloads each runs: a quorum has
# no semaphores (quorum mode refuses them) and no asyncio clients here (its async client runs
# each request in a worker thread, outside the simulation's threads).
TOPOLOGIES = ("server", "quorum", *(("cluster",) if cluster.SIMULATED else ()))
QUORUM_WORKLOADS = ("lock", "fair", "many", "want_result", "guards", "tasks")
# A Cluster: every workload but the asyncio clients' (cluster.py).
CLUSTER_WORKLOADS = ("lock", "fair", "semaphore", "many", "want_result", "guards", "tasks")

# The suite's share: seeds 0 to SHARE - 1 of each workload, faults on and off, on one
# server; QUORUM_SHARE of each on a quorum (its waiters poll: longer schedules), and
# CLUSTER_SHARE on a Cluster. ~50 s.
SHARE = 45
QUORUM_SHARE = 8
CLUSTER_SHARE = 8

# Where the share looks for each planted mutation: (first seed, schedules). A search from 0
# finds each at the seed in its comment; the share starts a little before it, so that a change
# of the simulation that moves it fails here and is looked at, not skipped. ``mutants --full``
# searches seeds 0-9,999 for each (the issue's bound). The scripts' mutations that only the
# flows' simulation finds (``join forgets when it queued``) are in
# tests/locks/test_simulation.py. Not looked for: ``a leave overtaken by its join`` (found at
# seed 1022 until a join's give-back followed it whatever timed out: that now ends what a late
# join took, and no seed of 0-9,999 shows the mark missing; tests/locks/test_scripts.py does);
# ``lock_many holds a member reported lost`` (found at 943, then 8,360, until the group came
# to refuse any member whose lease it cannot count on: a member reported lost is refused by
# that rule too, unless its refresh succeeds, when it is held indeed; no seed of 0-9,999 shows
# the difference).
PLANTED: dict[str, tuple[int, int]] = {
    "lock_many keeps what it took": (0, 20),  # 7
    "no give-back after a lost reply": (538, 20),  # 552
    "a grant used at its lease's last moment": (610, 20),  # 624
    "lock_many forgets a lapsed member": (0, 20),  # 3
    "a dead semaphore waiter is never pruned": (636, 20),  # 650
    "release ignores the token": (0, 20),  # 6
    "extend ignores the token": (4143, 20),  # 4157
    "unfair release never serves the starved": (159, 20),  # 173
    "semaphore miscounts": (0, 10),  # 0
    "join forgets the result": (137, 20),  # 151
    "a cancelled acquisition keeps its grant": (193, 20),  # 207
    "a cancelled request keeps what it took": (2714, 20),  # 2728
    "a cancelled waiter stays in line": (1732, 20),  # 1746
    "an interrupted quorum acquisition keeps what it took": (200, 10),  # 206 (quorum)
    "a join held up on its way keeps what it took": (4143, 20),  # 4157
    "a replay reaches a shared identity": (190, 20),  # 204
    "a fingerprint two forms share": (65, 20),  # 79
    "run_once marks a failed run done": (391, 20),  # 405
    "a group taken in one script leaves no record": (1595, 20),  # 1609
    "the watch takes a live holder for dead": (3, 10),  # 8
    "a duplicate reads the result before it passes the lock on": (2821, 20),  # 2835
    "a run uses a key that ran out as its reservation ended": (2095, 20),  # 2109
    "a run's end leaves no job id": (176, 20),  # 190
    "a leave interrupted again keeps a lease handed to it": (2789, 20),  # 2803
    "a job's record is the key's": (20, 20),  # 34
    "an interrupted quorum script never goes out whole": (1952, 12),  # 1962 (quorum)
    "a wake-up pushed without its expiry": (0, 20),  # 8
    "a cluster acquisition interrupted keeps what it took": (409, 20),  # 423 (cluster)
    "lock_many counts a refresh learnt too late": (8346, 20),  # 8360 (on a Cluster: 557 until
    # its commands went on their nodes' own pools; none of 0-9,999 there now)
    "a cluster connection interrupted is lent again unread": (16, 20),  # 30 (cluster)
}
# Where a planted mutation is looked for, when not on one server.
TOPOLOGY_OF: dict[str, str] = {
    "an interrupted quorum acquisition keeps what it took": "quorum",
    "an interrupted quorum script never goes out whole": "quorum",
    "a cluster acquisition interrupted keeps what it took": "cluster",
    "a cluster connection interrupted is lent again unread": "cluster",
}


def workloads_on(topology: str) -> tuple[str, ...]:
    return {"quorum": QUORUM_WORKLOADS, "cluster": CLUSTER_WORKLOADS}.get(topology, WORKLOADS)


class _Worlds:
    """The servers of each topology, started when first needed, stopped at the end."""

    def __init__(self) -> None:
        self.started: dict[str, World] = {}

    def __getitem__(self, topology: str) -> World:
        if topology not in self.started:
            directory = tempfile.mkdtemp(prefix=f"simulate-runtime-{topology}-")
            # (A Cluster's slot stays where it is: moves are the flows' simulation's.)
            options: dict[str, Any] = {}
            if topology == "cluster":  # (and the guards' budgets have a clock: guarded.py)
                options = {"moves": False, "clocks": (REPLAY_BUDGET_TAG,)}
            self.started[topology] = simulated_topology(topology, directory, **options)
        return self.started[topology]

    def stop(self) -> None:
        for world in self.started.values():
            world.stop()


def workload_of(mutation: str) -> str:
    """The workload that should notice ``mutation``."""
    if mutation in CODE_MUTATIONS:
        return CODE_MUTATIONS[mutation][4]
    return MUTATIONS[mutation][3]


@contextlib.contextmanager
def _applied(mutation: str | None) -> Iterator[Any]:
    """The mutation in place (the code's), and the scripts' patch (None: none)."""
    if mutation is None:
        yield None
    elif mutation in CODE_MUTATIONS:
        with mutated_code(mutation):
            yield None
    else:
        yield patch_for(mutation)


def _run(world: World, workload: str, seed: int, faults: Any, patch: Any) -> str | None:
    """One schedule: None when it passed, else why it failed (a world that broke: again)."""
    for _ in range(3):
        try:
            run_runtime_schedule(world, workload, SeededChoices(seed), faults, patch)
        except WorldFault:
            continue
        except SimulationFailed as failure:
            return str(failure)
        return None
    return "the world broke three times"


def _share(worlds: _Worlds, topologies: list[str] | None = None) -> int:
    """The suite's share (``topologies``: a part of it, which the suite runs side by side)."""
    failed = count = 0
    started = time.perf_counter()
    shares = {"server": SHARE, "quorum": QUORUM_SHARE, "cluster": CLUSTER_SHARE}
    for topology in [t for t in TOPOLOGIES if t in (topologies or TOPOLOGIES)]:
        seeds = shares[topology]
        for workload in workloads_on(topology):
            for faults in (NO_FAULTS, FAULTS_ON):
                for seed in range(seeds):
                    count += 1
                    why = _run(worlds[topology], workload, seed, faults, None)
                    if why is not None:
                        failed += 1
                        print(f"FAILED {workload} on {topology} seed {seed} faults "
                              f"{'on' if faults.on else 'off'}:\n{why}")  # fmt: skip
    print(f"{count} schedules, {failed} failed, {time.perf_counter() - started:.1f} s")
    return 1 if failed else 0


def _mutants(worlds: _Worlds, full: bool) -> int:
    missed = 0
    print("| planted mutation | workload | found at seed | seconds |")
    print("|---|---|---|---|")
    for mutation, (first, count) in PLANTED.items():
        if full:
            first, count = 0, 10_000
        workload = workload_of(mutation)
        topology = TOPOLOGY_OF.get(mutation, "server")
        if topology not in TOPOLOGIES:  # (a Cluster with this redis-py: cluster.SIMULATED)
            print(f"| {mutation} | {workload} ({topology}) | not simulated here | 0 |")
            continue
        started = time.perf_counter()
        found = None
        with _applied(mutation) as patch:
            for seed in range(first, first + count):
                if _run(worlds[topology], workload, seed, FAULTS_ON, patch) is not None:
                    found = seed
                    break
        seconds = time.perf_counter() - started
        missed += found is None
        at = str(found) if found is not None else f"MISSED ({first}-{first + count - 1})"
        where = workload if topology == "server" else f"{workload} ({topology})"
        print(f"| {mutation} | {where} | {at} | {seconds:.1f} |", flush=True)
    return 1 if missed else 0


def _campaign(worlds: _Worlds, args: argparse.Namespace) -> int:
    failed = total = 0
    started = time.perf_counter()
    faults = FAULTS_ON if args.faults == "on" else NO_FAULTS
    for topology in [t for t in args.topology or TOPOLOGIES if t in TOPOLOGIES]:
        workloads = [w for w in args.workload or WORKLOADS if w in workloads_on(topology)]
        for workload in workloads:
            for seed in range(args.first_seed, args.first_seed + args.schedules):
                why = _run(worlds[topology], workload, seed, faults, None)
                if why is not None:
                    failed += 1
                    print(f"FAILED {workload} on {topology} seed {seed}: replay with python -m "
                          f"tests.simulation.runtime replay --seed {seed} --workload {workload}"
                          f" --topology {topology} --faults {args.faults}\n"
                          f"{why.splitlines()[0]}", flush=True)  # fmt: skip
            total += args.schedules
            print(f"{workload} on {topology}: {args.schedules:,} schedules, "
                  f"{time.perf_counter() - started:,.0f} s so far", flush=True)  # fmt: skip
    if not total:
        print("no workload and topology of the runtime simulation chosen; none run")
    print(f"{total:,} schedules, {failed} failed, {time.perf_counter() - started:,.0f} s")
    return 1 if failed else 0


def _quiet_about_coroutines(unraisable: Any) -> None:
    if not (inspect.iscoroutine(unraisable.object) or inspect.isasyncgen(unraisable.object)):
        sys.__unraisablehook__(unraisable)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation.runtime")
    parser.add_argument("command", choices=("share", "mutants", "campaign", "replay"))
    parser.add_argument("--workload", action="append", help=f"one of {', '.join(WORKLOADS)}")
    parser.add_argument("--topology", action="append", help=f"one of {', '.join(TOPOLOGIES)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--faults", choices=("on", "off"), default="on")
    parser.add_argument("--mutation", help="replay: with this planted mutation")
    parser.add_argument("--full", action="store_true", help="mutants: seeds 0-9,999 each")
    args = parser.parse_args(argv)
    logging.getLogger("django_redis_lock").setLevel(logging.CRITICAL)  # (faults log errors)
    # A crashed process's event loop is left with its tasks pending, as a dead one's: neither
    # asyncio's word on them nor what their coroutines raise when collected is news.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    sys.unraisablehook = _quiet_about_coroutines
    worlds = _Worlds()
    try:
        if args.command == "share":
            return _share(worlds, args.topology)
        if args.command == "mutants":
            return _mutants(worlds, args.full)
        if args.command == "campaign":
            return _campaign(worlds, args)
        workload = (args.workload or [workload_of(args.mutation) if args.mutation else "lock"])[0]
        topology = (args.topology or [TOPOLOGY_OF.get(args.mutation or "", "server")])[0]
        faults = FAULTS_ON if args.faults == "on" else NO_FAULTS
        with _applied(args.mutation) as patch:
            why = _run(worlds[topology], workload, args.seed, faults, patch)
        print(why or "passed")
        return 1 if why else 0
    finally:
        worlds.stop()


if __name__ == "__main__":
    sys.exit(main())
