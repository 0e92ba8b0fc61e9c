"""``make mutants``: each planted mutation (``tests/simulation/mutations.py``) applied to a
scratch copy of the tree, then the runtime simulation's share for it and the ordinary suite
(``MUTANT_TESTS``, default ``tests/locks``) run there; a table says which found it. Exits 1 when
the simulation's share missed one.

    python -m dev.mutants                       # every planted mutation
    python -m dev.mutants "semaphore miscounts" # one
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from tests.simulation.mutations import CODE_MUTATIONS, MUTATIONS
from tests.simulation.runtime.__main__ import PLANTED, TOPOLOGY_OF, workload_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IGNORED = shutil.ignore_patterns(
    ".git", ".venv*", ".tox", "site", "dist", "build", "__pycache__", "*.egg-info",
    ".mypy_cache", ".ruff_cache", ".pytest_cache",
)  # fmt: skip


def _mutated_file(scratch: str, mutation: str) -> str:
    """Apply ``mutation`` to its file in ``scratch``; returns that file's path in the tree."""
    if mutation in CODE_MUTATIONS:
        module, _, old, new, _ = CODE_MUTATIONS[mutation]
        candidates = [module.replace(".", "/") + ".py"]
    else:
        _, old, new, _ = MUTATIONS[mutation]
        candidates = []
        for directory, _, files in os.walk(os.path.join(scratch, "django_redis_lock")):
            for name in files:
                if name.endswith((".lua", ".py")):
                    path = os.path.relpath(os.path.join(directory, name), scratch)
                    with open(os.path.join(scratch, path), encoding="utf-8") as file:
                        if old in file.read():
                            candidates.append(path)
    if len(candidates) != 1:
        raise SystemExit(f"{mutation!r}: its text is in {len(candidates)} files, not one")
    path = os.path.join(scratch, candidates[0])
    with open(path, encoding="utf-8") as file:
        source = file.read()
    if source.count(old) != 1:
        raise SystemExit(f"{mutation!r}: its text is in {candidates[0]} {source.count(old)} times")
    with open(path, "w", encoding="utf-8") as file:
        file.write(source.replace(old, new))
    return candidates[0]


def _found_by_simulation(scratch: str, mutation: str) -> str:
    first, count = PLANTED[mutation]
    done = subprocess.run(
        [sys.executable, "-m", "tests.simulation.runtime", "campaign",
         "--workload", workload_of(mutation),
         "--topology", TOPOLOGY_OF.get(mutation, "server"),
         "--first-seed", str(first), "--schedules", str(count)],
        cwd=scratch, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if done.returncode == 0:
        return "missed"
    for line in done.stdout.splitlines():
        if line.startswith("FAILED"):
            return "found, " + line.split(":", 1)[0].removeprefix("FAILED ")
    return "error: " + (done.stderr.strip().splitlines() or ["?"])[-1]


def _found_by_suite(scratch: str) -> str:
    tests = os.environ.get("MUTANT_TESTS", "tests/locks").split()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-n", os.environ.get("TEST_JOBS", "4"),
         "-p", "no:cacheprovider", *tests],
        cwd=scratch, capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    if done.returncode == 0:
        return "missed"
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    return "found" + (f" ({failed[0].split('::')[-1][:60]})" if failed else "")


def main(argv: list[str]) -> int:
    mutations = argv or list(PLANTED)
    missed = 0
    print("| planted mutation | file | runtime simulation's share | ordinary suite | s |")
    print("|---|---|---|---|---|", flush=True)
    for mutation in mutations:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="mutant-") as scratch:
            tree = os.path.join(scratch, "tree")
            shutil.copytree(ROOT, tree, ignore=IGNORED)
            path = _mutated_file(tree, mutation)
            simulation = _found_by_simulation(tree, mutation)
            suite = _found_by_suite(tree)
        missed += simulation == "missed" or simulation.startswith("error")
        seconds = time.perf_counter() - started
        print(f"| {mutation} | `{path}` | {simulation} | {suite} | {seconds:.0f} |", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
