"""The simulation of the library's own code (``tests/simulation/runtime/``): its share of
schedules, that it finds each planted mutation, and that a seed replays exactly.

It takes the process it runs in over (its clock, its threads), so each test runs it in a
process of its own, on a redis-server of its own; a failure prints the seed and its trace.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from django_redis_lock.core import flows, uncontended
from tests.simulation.mutations import CODE_MUTATIONS, mutated_code
from tests.simulation.runtime.__main__ import PLANTED, TOPOLOGIES
from tests.simulation.runtime.processes import PER_PROCESS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.simulation.runtime", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


# One test per topology, so that the suite's workers run them side by side (the whole share is
# about 60 s alone; a loaded machine, four workers on two cores, may take several times that:
# the subprocess has its own limit, 600 s).
@pytest.mark.timeout(660)
@pytest.mark.parametrize("topology", ["server", "quorum", "cluster"])
def test_every_schedule_of_the_share_keeps_the_invariants(topology: str) -> None:
    if topology not in TOPOLOGIES:
        pytest.skip(f"{topology} is not simulated with this redis-py (runtime/cluster.py)")
    done = _simulate("share", "--topology", topology)
    assert done.returncode == 0, done.stdout[-20_000:] + done.stderr[-5_000:]
    assert ", 0 failed" in done.stdout


@pytest.mark.timeout(660)
def test_each_planted_mutation_is_found() -> None:
    done = _simulate("mutants")
    assert done.returncode == 0, done.stdout + done.stderr[-5_000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) == len(PLANTED) + 1  # (the header, then one row each)
    assert "MISSED" not in done.stdout


@pytest.mark.parametrize(
    ("seed", "workload", "topology"),
    [(1011, "semaphore", "server"), (2418, "many", "server"), (9, "many", "server"),
     (28, "lock", "quorum"), (4991, "lock", "server"), (8080, "tasks", "server"),
     (1992, "guards", "quorum"), (557, "many", "cluster"), (1117, "many", "cluster"),
     (200122, "semaphore", "cluster")],
)  # fmt: skip
def test_the_schedules_that_found_defects_pass(seed: int, workload: str, topology: str) -> None:
    """Each found a defect of the library, fixed since: a permit handed to nobody after an
    interrupted join (1011), a lock_many that said it held a member that had lapsed (2418), or
    whose grant came after its lease (9), a quorum acquisition interrupted with its requests
    out that gave nothing back (28), a queue join held up on its way past the socket timeout
    that took the lock for nobody when it arrived (4991), a task's copy that ran again after a
    later task of its key finished (8080), a quorum release interrupted twice on members
    without its script that left them the lease (1992), a group held with a member whose
    refresh was learnt of too late (557, on a Cluster), a reply read by the next command on a
    connection interrupted before its read (on a Cluster: the slot map read again, 1117; a
    script's loading, 200122). (Their seeds may stop reaching the
    same spot when the simulation changes; the defects' own tests are in test_scripts.py,
    test_lock_many.py, test_lost_replies.py, test_cancellation.py and test_reservations.py,
    and 4991's is this simulation's: its planted mutation.)"""
    done = _simulate("replay", "--seed", str(seed), "--workload", workload, "--topology", topology)
    assert done.returncode == 0, done.stdout[-20_000:] + done.stderr[-5_000:]


def test_a_code_mutation_is_applied_and_taken_back() -> None:
    original = uncontended.learnt_late
    with mutated_code("a grant used at its lease's last moment"):
        assert uncontended.learnt_late is not original
        assert flows.learnt_late is uncontended.learnt_late  # (imported by name there)
        assert not uncontended.learnt_late(1.0, 1000, 2.0)  # the mutant: at its last moment
    assert uncontended.learnt_late is original
    assert flows.learnt_late is original
    assert original(1.0, 1000, 2.0)
    assert set(CODE_MUTATIONS) <= set(PLANTED)


def test_every_per_process_object_of_the_library_is_simulated_per_process() -> None:
    """What the library resets in a forked child is what it keeps per process: the runtime
    simulation gives each simulated process its own (``processes.PER_PROCESS``, the watchdog,
    the identity, the watch for dead holders), or says why one is shared (the advice on
    eviction is given once, before the schedule). A new one fails here until the simulation
    knows it."""
    simulated = set()
    for module, name in PER_PROCESS:  # (by its name, or its class's for a self-registered one)
        stem = module.__name__.rsplit(".", 1)[-1]
        simulated |= {f"{stem}.{name}", f"{stem}.{type(getattr(module, name)).__name__}"}
    simulated |= {"renewal.Renewer", "owners.new_identity"}
    shared = {"eviction.advised"}
    found = set()
    package = pathlib.Path(ROOT, "django_redis_lock", "primitives")
    for path in package.rglob("*.py"):
        text = path.read_text()
        for target in re.findall(r"register_at_fork\(after_in_child=([\w.]+)\)", text):
            owner = target.rsplit(".", 1)[0] if "." in target else target
            if owner == "self":  # (a class's own: named by the class that registers it)
                before = text[: text.index(f"after_in_child={target}")]
                owner = re.findall(r"^class (\w+)", before, re.M)[-1]
            found.add(f"{path.stem}.{owner}")
    assert found <= simulated | shared, found - simulated - shared
