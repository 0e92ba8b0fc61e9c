"""A waiter that dies while queued: how long the live waiter behind it waits for the lock.

    make bench    # or: .venv/bin/python -m benchmarks.bench_dead_waiter [--quick] [--before REF]

One private redis-server (``harness.servers.private_redis``). Each trial: this process holds a lock
(``Lock(name)``, the default renewed lease); a first waiter process queues for it, then a second
(``Lock(name, wait=60).acquire()``, each a process of its own); the first waiter is SIGKILLed; the
holder releases, and the second waiter reports when it has the lock (``time.monotonic()``, which is
one clock for every process of the machine). Measured: kill -> the live waiter holds the lock, in
two cases:

- **release at once**: the holder releases right after the kill (a fault that kills waiters
  while the lock is busy: a worker killed, a connection cut);
- **release late**: the holder releases 0.2 s before the dead waiter's liveness deadline (read
  from the queue, by the server's clock): the worst moment, when the release still counts it
  alive and hands it the lease.

The documented bound: a waiter that dies while queued holds up the waiters behind it at most
until its liveness window ends (``core/flows.py``: one block of ``BLOCK_CAP`` plus
``LIVENESS_SLACK``, 3 s after it last asked). ``--before REF`` runs the same trials with the
package as it was at git ``REF`` too (a temporary ``git worktree``), side by side. Results go to
``benchmarks/results-dead-waiter.md`` (and stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from benchmarks.harness.machine import ROOT, worktree_at
from benchmarks.harness.servers import private_redis

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results-dead-waiter.md"
LATE_MARGIN = 0.2  # "release late": this long before the dead waiter's liveness deadline

# A waiter process: the package from the tree given on its command line.
WAITER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    import django
    from django.conf import settings
    settings.configure(
        INSTALLED_APPS=["django_redis_lock"], USE_TZ=True,
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": sys.argv[2]}},
    )
    django.setup()
    from django_redis_lock import Lock
    lock = Lock(sys.argv[3], wait=60)
    print("waiting", flush=True)
    acquired = lock.acquire()
    print("acquired" if acquired else "gave up", time.monotonic(), flush=True)
    if acquired:
        lock.release()
    """
)


@dataclass
class Case:
    seconds: list[float] = field(default_factory=list)  # kill -> the live waiter holds it

    def cell(self) -> str:
        if not self.seconds:
            return "n/a"
        return (
            f"{statistics.median(self.seconds):.2f} s (max {max(self.seconds):.2f},"
            f" {len(self.seconds)} trials)"
        )


@dataclass
class Tree:
    title: str
    root: Path
    at_once: Case = field(default_factory=Case)
    late: Case = field(default_factory=Case)
    error: str | None = None


def start_waiter(root: Path, url: str, name: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", WAITER, str(root), url, name],
        stdout=subprocess.PIPE, text=True, cwd=root,
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if line != "waiting":
        raise RuntimeError(f"a waiter said {line!r}")
    return process


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.005)


def in_line(admin: redis.Redis) -> int:
    """How many wait in the one queue of the (private) server."""
    return sum(admin.llen(queue) for queue in admin.keys("*:q"))


def server_ms(admin: redis.Redis) -> int:
    seconds, micros = admin.time()
    return int(seconds) * 1000 + int(micros) // 1000


def trial(tree: Tree, url: str, number: int, late: bool) -> float:
    """One trial; returns kill -> the live waiter holds the lock, seconds. Runs in a child
    process of its own for ``tree``'s package (the script ``HOLDER``)."""
    name = f"bench:dead-waiter:{number}:{int(late)}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tree.root), url, name, "1" if late else "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tree.root,
    )  # fmt: skip
    try:
        out, err = holder.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        holder.kill()
        raise RuntimeError("a trial did not finish in 90 s") from None
    lines = [line for line in out.splitlines() if line.startswith("result ")]
    if holder.returncode != 0 or not lines:
        raise RuntimeError(f"a trial failed: {(err or out).strip().splitlines()[-1:]}")
    return float(lines[-1].split()[1])


# The holder, in a process of its own for the tree under test (it imports that tree's package):
# takes the lock, starts the two waiters, kills the first, releases (at once, or late), and
# prints kill -> the second has the lock. Its helpers are this module's, from this work tree
# (ROOT_DIR), which goes first on the path only once that tree's package is imported.
HOLDER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    root, url, name, late = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    sys.path.insert(0, root)
    import django
    from django.conf import settings
    settings.configure(
        INSTALLED_APPS=["django_redis_lock"], USE_TZ=True,
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}},
    )
    django.setup()
    import redis
    from pathlib import Path
    from django_redis_lock import Lock
    sys.path.insert(0, ROOT_DIR)
    from benchmarks import bench_dead_waiter as b
    admin = redis.Redis.from_url(url)
    lock = Lock(name)
    assert lock.acquire(wait=0)
    first = b.start_waiter(Path(root), url, name)
    b.wait_for(lambda: b.in_line(admin) == 1, 30, "the first in line")
    second = b.start_waiter(Path(root), url, name)
    b.wait_for(lambda: b.in_line(admin) == 2, 30, "the second in line")
    [queue] = admin.keys("*:q")
    dead = admin.lindex(queue, 0)
    waiters = queue[:-1] + b"d"
    os.kill(first.pid, signal.SIGKILL)
    killed = time.monotonic()
    first.wait()
    if late:
        deadline = int(admin.hget(waiters, dead).split(b"|", 1)[0])
        left = (deadline - b.server_ms(admin)) / 1000 - b.LATE_MARGIN
        if left > 0:
            time.sleep(left)
    lock.release()
    said, when = second.stdout.readline().split()
    second.wait()
    assert said == "acquired", said
    print("result", float(when) - killed, flush=True)
    """
).replace("ROOT_DIR", repr(str(ROOT)))


def run(trees: Sequence[Tree], url: str, trials: int) -> None:
    admin = redis.Redis.from_url(url)
    for number in range(trials):
        for tree in trees:  # round robin: each tree sees the same machine
            if tree.error:
                continue
            for late, case in ((False, tree.at_once), (True, tree.late)):
                try:
                    case.seconds.append(trial(tree, url, number, late))
                except Exception as exc:
                    tree.error = f"{type(exc).__name__}: {exc}"
                    break
                admin.flushdb()
            print(f"{tree.title}: trial {number + 1}: {tree.at_once.cell()} / {tree.late.cell()}")


def report(trees: Sequence[Tree], trials: int) -> str:
    lines = [
        "# A waiter that dies while queued",
        "",
        f"Run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by"
        " `benchmarks/bench_dead_waiter.py`; see its docstring. Kill -> the live waiter behind"
        " the dead one holds the lock (median, max). Documented bound: the dead waiter's"
        " liveness window, 3 s after it last asked.",
        "",
        "| package | release at once | release late (0.2 s before its deadline) |",
        "|---|---|---|",
    ]
    for tree in trees:
        lines.append(f"| {tree.title} | {tree.at_once.cell()} | {tree.late.cell()} |")
        if tree.error:
            lines.append(f"| {tree.title}: error | {tree.error} | |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 trials instead of 6")
    parser.add_argument("--before", metavar="REF", help="also run the package at git REF")
    args = parser.parse_args(argv)
    trials = 2 if args.quick else 6
    with contextlib.ExitStack() as stack:
        trees = [Tree("this tree", ROOT)]
        if args.before:
            trees.append(Tree(f"at {args.before}", stack.enter_context(worktree_at(args.before))))
        url = stack.enter_context(private_redis())
        run(trees, url, trials)
    text = report(trees, trials)
    RESULTS.write_text(text)
    print(text)
    return 1 if any(tree.error for tree in trees) else 0


if __name__ == "__main__":
    sys.exit(main())
