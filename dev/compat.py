"""``make compat REF=<git ref>``: a rolling deploy in small. Processes of another version (the
*old* side: ``REF``'s ``django_redis_lock``) and of this tree (the *new* side) take the same
locks on one Redis at once, and a table says whether each check held. Exits 1 when one failed.

    python -m dev.compat --ref v1.0.0            # the release before this one, as a deploy mixes
    python -m dev.compat --ref 120fa98 --rounds 40
    python -m dev.compat --tree /elsewhere       # a tree holding a django_redis_lock/ package

Each side's workers (``dev/compat_worker.py``, run by path with the side's tree first on
``PYTHONPATH``) run the same scenarios through the public API, all at once:

- ``fifo``, ``unfair``: one ``Lock`` (``fair=True``, ``fair=False``): never two holders, no lost
  update, fencing tokens that only grow, the lock handed between the sides both ways, and no
  acquisition left waiting for a wake-up the other side never sends (``--stall``);
- ``semaphore``: never more than its limit of 2 holders;
- ``many``: ``lock_many`` over two of three names and single ``Lock``s of them: no name held twice;
- ``once``, ``stampede``, ``submit``: ``run_once``, ``get_or_set_locked`` and
  ``prevent_double_submit``, each round's body run once, the others reading its kept result;
- ``records``: each side reads the other's held lock and permit (label, pid, host) as the admin
  and ``redis_locks`` do;
- ``dead holder``: a holder of one side killed with SIGKILL, a waiter of the other side on the
  same host takes the lock long before its lease (120 s) would have ended.

Both sides run on this venv's dependencies: a REF that needs others needs its own run.
``--key-prefix-old`` gives the old side another ``DJANGO_REDIS_LOCK_KEY_PREFIX``: the two sides
then never meet, which the checks must report (the tool's own test).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from io import BytesIO

import redis

from dev.compat_worker import SCENARIOS, evidence_key
from dev.embedded_redis import EmbeddedRedis, die_with_parent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "dev", "compat_worker.py")
SIDES = ("old", "new")


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


def git(*args: str) -> bytes:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=True).stdout
    except subprocess.CalledProcessError as error:
        raise SystemExit(
            f"compat: git {' '.join(args)}: {error.stderr.decode().strip()}"
        ) from None


def tree_of(ref: str) -> str:
    """``ref``'s ``django_redis_lock/``, unpacked once into ``build/compat/<commit>/``."""
    commit = git("rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}").decode().strip()
    tree = os.path.join(ROOT, "build", "compat", commit)
    if not os.path.isdir(os.path.join(tree, "django_redis_lock")):
        archive = git("archive", "--format=tar", commit, "django_redis_lock")
        os.makedirs(os.path.dirname(tree), exist_ok=True)
        unpacking = tempfile.mkdtemp(dir=os.path.dirname(tree))
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            if hasattr(tarfile, "data_filter"):  # Python 3.12+, and the 3.10/3.11 fixes
                tar.extraction_filter = tarfile.data_filter
            tar.extractall(unpacking)
        try:
            os.replace(unpacking, tree)
        except OSError:  # another run unpacked it meanwhile
            shutil.rmtree(unpacking)
    return tree


class Deploy:
    """The two sides' processes on one private Redis."""

    def __init__(self, args: argparse.Namespace, url: str) -> None:
        self.url = url
        self.trees = {"old": args.old_tree, "new": ROOT}
        self.prefixes = {"old": args.key_prefix_old, "new": None}
        self.args = args
        self.evidence = redis.Redis.from_url(url, decode_responses=True)

    def command(self, side: str, mode: str, *extra: str) -> tuple[list[str], dict[str, str]]:
        command = [sys.executable, WORKER, mode, "--url", self.url, "--side", side]
        command += ["--tree", self.trees[side], *extra]
        if self.prefixes[side] is not None:
            command += ["--key-prefix", self.prefixes[side]]
        env = {**os.environ, "PYTHONPATH": self.trees[side]}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        return command, env

    def start(self, side: str, mode: str, *extra: str) -> subprocess.Popen[str]:
        """A worker, which the kernel stops if this process dies (no orphan holding a lock
        for an hour); its stderr passes through."""
        command, env = self.command(side, mode, *extra)
        return subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent
        )

    def run_scenarios(self) -> list[str]:
        """Every worker through every scenario; returns each side's version."""
        workers = self.args.workers
        processes = []
        try:
            for side in SIDES:
                for index in range(workers):
                    extra = ["--index", str(index), "--total", str(2 * workers)]
                    extra += ["--rounds", str(self.args.rounds)]
                    for scenario in self.args.scenario or SCENARIOS:
                        extra += ["--scenario", scenario]
                    processes.append(self.start(side, "run", *extra))
            versions = []
            for number, process in enumerate(processes):
                out, _ = process.communicate(timeout=1200)
                if process.returncode != 0:
                    side, index = SIDES[number // workers], number % workers
                    raise SystemExit(
                        f"compat: the {side} side's worker {index} failed with exit status "
                        f"{process.returncode}; its output is above"
                    )
                versions.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.communicate()
        return sorted({f"{v['side']} {v['version']}" for v in versions})

    def dead_holder(self, holding: str, taking: str) -> Check:
        """A holder of one side killed (SIGKILL) while a waiter of the other is in line: the
        waiter learns of the death from the holder's process record (same host), not from
        the end of its lease (120 s)."""
        name = f"compat-dead-{holding}"
        check = f"dead holder: {holding} killed, {taking} takes over"
        holder = self.start(holding, "hold", "--name", name)
        taker = None
        try:
            if line_of(holder) != "held":
                return Check(check, False, f"the holder did not hold it ({holder.poll()})")
            taker = self.start(taking, "take", "--name", name)
            said = line_of(taker)
            if said != "queued":
                if said.startswith("{") and json.loads(said)["acquired"]:
                    return Check(check, False, "taken while its holder lived: two holders")
                return Check(check, False, f"the waiter said {said!r} ({taker.poll()})")
            holder.kill()
            killed = time.monotonic()
            holder.wait()  # reaped: a zombie's pid still answers kill(pid, 0)
            said = line_of(taker, timeout=150)
        finally:
            for process in (holder, taker):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.communicate()
        if not said.startswith("{"):
            return Check(check, False, f"the waiter said {said!r} ({taker.poll()})")
        result = json.loads(said)
        waited = result["at"] - killed
        return Check(
            check,
            result["acquired"] and waited < self.args.handoff,
            f"taken {waited * 1000:.0f} ms after the kill (the lease: 120 s)",
        )


def line_of(process: subprocess.Popen[str], timeout: float = 60) -> str:
    """The process's next line of output; "" if it ends or says nothing for ``timeout`` s."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    return process.stdout.readline().strip() if ready else ""


def check(deploy: Deploy, scenarios: list[str], rounds: int, workers: int) -> list[Check]:
    """The invariants of the evidence the workers left (dev/compat_worker.py's docstring)."""
    evidence = deploy.evidence
    stall = deploy.args.stall
    checks = []
    total = rounds * workers * 2

    def get(scenario: str, *parts: str) -> str | None:
        value = evidence.get(evidence_key(scenario, *parts))
        return None if value is None else str(value)

    def items(scenario: str, what: str) -> list[str]:
        return [str(item) for item in evidence.lrange(evidence_key(scenario, what), 0, -1)]

    def add(name: str, passed: bool, detail: str) -> None:
        checks.append(Check(name, passed, detail))

    for scenario in scenarios:
        problems = items(scenario, "problems")
        if problems:
            add(f"{scenario}: what the workers saw", False, "; ".join(problems[:3]))
    for scenario in ("fifo", "unfair"):
        if scenario not in scenarios:
            continue
        most = int(get(scenario, "most", "lock") or 0)
        count = int(get(scenario, "count") or 0)
        add(f"{scenario}: one holder at a time", most == 1, f"at most {most} inside at once")
        add(f"{scenario}: no lost update", count == total, f"{count} of {total} updates")
        add_handoffs(checks, scenario, items(scenario, "handoffs"), deploy.args.handoff)
        add_waits(checks, scenario, items(scenario, "waits"), stall)
    if "semaphore" in scenarios:
        most = int(get("semaphore", "most", "permits") or 0)
        add("semaphore: at most its limit (2)", most <= 2, f"at most {most} at once")
        add_waits(checks, "semaphore", items("semaphore", "waits"), stall)
    if "many" in scenarios:
        most = max(int(get("many", "most", name) or 0) for name in "abc")
        add("many: no name held twice", most == 1, f"at most {most} holders of one name")
        add_waits(checks, "many", items("many", "waits"), stall)
    for scenario in ("once", "stampede", "submit", "tasks"):
        if scenario in scenarios:
            runs = [int(get(scenario, "runs", str(round_)) or 0) for round_ in range(rounds)]
            wrong = [(round_, n) for round_, n in enumerate(runs) if n != 1]
            add(
                f"{scenario}: each round run once",
                not wrong,
                f"{sum(runs)} runs for {rounds} rounds"
                + (f"; (round, runs) {wrong[:4]}" if wrong else ""),
            )
    if "stampede" in scenarios:
        split = [
            r for r in range(rounds) if evidence.scard(evidence_key("stampede", "values", r)) != 1
        ]
        add("stampede: every side read one value", not split, f"rounds with two values: {split}")
    if "submit" in scenarios:
        statuses: set[str] = set()
        mixed = []
        for round_ in range(rounds):
            answers = {
                str(a) for a in evidence.smembers(evidence_key("submit", "answers", round_))
            }
            statuses |= {answer.split()[0] for answer in answers}
            if len({answer for answer in answers if answer.startswith("200 ")}) != 1:
                mixed.append(round_)
        add(
            "submit: the others replayed its response (or 409)",
            not mixed and statuses <= {"200", "409"},
            f"statuses {sorted(statuses)}"
            + (f"; rounds not one response: {mixed[:4]}" if mixed else ""),
        )
    if "tasks" in scenarios:
        most = max(int(get("tasks", "most", str(round_)) or 0) for round_ in range(rounds))
        add("tasks: one run of a key at a time", most == 1, f"at most {most} runs at once")
    if "records" in scenarios:
        read = not items("records", "problems")
        add("records: each side reads the other's", read, "label, pid and host of each")
    return checks


def add_handoffs(checks: list[Check], scenario: str, handoffs: list[str], most: float) -> None:
    """The lock's way from a release to a waiter already in line, when the two are of
    different sides: the other side's wake-up reached it (a waiter that was not woken finds
    out on its own, up to 2 s later), and the sides did meet (one lock, not two)."""
    across = [
        float(ms) / 1000
        for way, ms in (handoff.split() for handoff in handoffs)
        if way in ("old>new", "new>old")
    ]
    longest = max(across, default=0.0)
    checks.append(
        Check(
            f"{scenario}: handed between the sides at once",
            bool(across) and longest < most,
            f"{len(across)} handoffs across, the slowest {longest * 1000:.0f} ms",
        )
    )


def add_waits(
    checks: list[Check], scenario: str, waits: list[str], stall: float, more: str = ""
) -> None:
    """A waiter no release of the other side woke waits for its wait to run out: the
    longest wait says so (the holders hold a millisecond or two)."""
    longest = max((float(ms) for ms in waits), default=0.0) / 1000
    checks.append(
        Check(
            f"{scenario}: no waiter stalled",
            longest < stall,
            f"longest wait {longest:.2f} s of {len(waits)}" + (f"; {more}" if more else ""),
        )
    )


def report(checks: list[Check], versions: list[str], ref: str) -> str:
    lines = [f"compat: {ref} (old) beside this tree (new): {', '.join(versions)}", ""]
    width = max(len(check.name) for check in checks)
    for check in checks:
        lines.append(
            f"{'ok  ' if check.passed else 'FAIL'}  {check.name:<{width}}  {check.detail}"
        )
    failed = sum(not check.passed for check in checks)
    lines += ["", f"{len(checks) - failed} passed, {failed} failed"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ref", help="the old side: a git ref of this repository")
    source.add_argument("--tree", help="the old side: a folder holding django_redis_lock/")
    parser.add_argument("--workers", type=int, default=3, help="processes per side (3)")
    parser.add_argument("--rounds", type=int, default=20, help="rounds per scenario (20)")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS)
    parser.add_argument("--no-dead-holder", action="store_true")
    parser.add_argument(
        "--stall", type=float, default=2.0, help="an acquisition's wait this long, s: stalled (2)"
    )
    parser.add_argument(
        "--handoff", type=float, default=0.5,
        help="a handoff or a dead holder's replacement this long, s: too late (0.5)",
    )  # fmt: skip
    parser.add_argument("--key-prefix-old", help="the old side's DJANGO_REDIS_LOCK_KEY_PREFIX")
    parser.add_argument("--json", action="store_true", help="the checks as JSON")
    args = parser.parse_args(argv)
    args.old_tree = os.path.abspath(args.tree) if args.tree else tree_of(args.ref)
    scenarios = args.scenario or SCENARIOS
    with EmbeddedRedis() as server:
        deploy = Deploy(args, server.url)
        versions = deploy.run_scenarios()
        checks = check(deploy, scenarios, args.rounds, args.workers)
        if not args.no_dead_holder and sys.platform.startswith("linux"):
            # (Elsewhere a dead holder's lease runs out: no process records to read it from.)
            checks += [deploy.dead_holder("old", "new"), deploy.dead_holder("new", "old")]
    if args.json:
        print(json.dumps([check.__dict__ for check in checks], indent=2))
    else:
        print(report(checks, versions, args.ref or args.tree))
    return 0 if all(check.passed for check in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
