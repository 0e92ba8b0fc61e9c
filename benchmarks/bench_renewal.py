"""Renewal at scale: one process holds N auto-renewed locks; what keeping them alive costs.

    make bench                       # or: .venv/bin/python -m benchmarks.bench_renewal [--quick]

One private redis-server (``harness.servers.private_redis``, as ``bench.py``). For each N (1,000
and 10,000; ``--quick``: 1,000), this process takes N locks, ``Lock(f"renew:{i}", timeout=3,
auto_renew=True)``, keeps every ``Lock`` referenced, and once all are held measures a window of
10 s (``--quick``: 4 s) in which it does nothing but let the watchdog (``renewal.py``: daemon
threads of this same process) renew them. Over the window:

- the process's CPU time (``time.process_time()``: every thread of it) as a share of one core;
- the requests it sent: ``harness.records.RequestCounter`` wraps redis-py's
  ``AbstractConnection.send_packed_command``, so one call is one round trip (a pipeline is one);
- the leases renewed, counted by the server: ``INFO commandstats`` ``PEXPIRE`` calls over the
  window. While the locks are only held (no waiter, no release), the one thing that runs
  ``PEXPIRE`` is ``extend_many.lua``, once per lease it renews (a lease no longer ours is left
  alone). ``EVALSHA`` calls (script calls) are shown next to it;
- redis-server's CPU (``INFO cpu``) as a share of one core;
- locks lost: ``lock_lost`` signals received (from the first acquisition to the end of the
  window), and, at the end of the window, leases whose key no longer holds our token.

python-redis-lock holds the same N locks with ``Lock(client, name, expire=3,
auto_renewal=True)`` on one shared client: a thread per lock that runs its extend script every
2 s (``expire * 2/3``), whose one ``EXPIRE`` per renewed lease is what is counted for it. It has
no lost signal: an exception that ends a renewal thread (``NotAcquired`` when the lease was
gone) is counted instead, with the end check.

A renewal cycle is one renewal of every held lease: round trips per cycle = round trips x N /
leases renewed. Results go to ``benchmarks/results-renewal.md`` (and stdout), with the targets.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness.machine import describe_machine, log
from benchmarks.harness.markdown import fmt, heading, md_table, na_row
from benchmarks.harness.records import RequestCounter, WorkConnection, command_calls, server_cpu
from benchmarks.harness.rivals import configure_django
from benchmarks.harness.servers import private_redis
from benchmarks.harness.variants import VARIANT_BY_KEY, unavailable_reason

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Params:
    counts: tuple[int, ...] = (1000, 10000)  # locks held at once, ours
    others_counts: tuple[int, ...] = (1000, 10000)  # the same for python-redis-lock
    lease: float = 3.0  # seconds
    window: float = 10.0  # the measured window, once every lock is held


FULL = Params()
QUICK = Params(counts=(1000,), others_counts=(1000,), window=4.0)

OURS = "ours"
PRL = "python_redis_lock"
TITLES = {
    OURS: "ours: `Lock(name, timeout=3, auto_renew=True)` (batched watchdog)",
    PRL: "python-redis-lock: `Lock(client, name, expire=3, auto_renewal=True)` (a thread per "
    "lock)",
}
RENEWED_BY = {OURS: "pexpire", PRL: "expire"}  # the command each runs once per renewed lease
PRL_POOL = 100  # python-redis-lock's connections (a BlockingConnectionPool)


# -- holding N locks -----------------------------------------------------------------------


@dataclass
class Held:
    """N held locks of one library, and how to check and release them."""

    locks: list[Any]
    still_ours: Callable[[redis.Redis], int]  # leases that still hold our token now
    release: Callable[[], None]


def _count_matching(admin: redis.Redis, pairs: Sequence[tuple[str, bytes]]) -> int:
    """How many of (key, expected value prefix) hold a value starting with that prefix."""
    matching = 0
    for start in range(0, len(pairs), 1000):
        chunk = pairs[start : start + 1000]
        pipe = admin.pipeline(transaction=False)
        for key, _ in chunk:
            pipe.get(key)
        for (_, prefix), value in zip(chunk, pipe.execute(), strict=True):
            matching += bool(value is not None and value.startswith(prefix))
    return matching


@contextlib.contextmanager
def _released_on_error(release: Callable[[], None]) -> Iterator[None]:
    """Release what was taken when taking the rest failed (no renewal left running)."""
    try:
        yield
    except BaseException:
        release()
        raise


def hold_ours(url: str, names: Sequence[str], lease: float) -> Held:
    from django_redis_lock import Lock
    from django_redis_lock.primitives.keys import lock_keys

    locks = [Lock(name, timeout=lease, auto_renew=True) for name in names]

    def release() -> None:
        for lock in locks:
            with contextlib.suppress(Exception):  # not held, or lost: nothing to release
                lock.release()

    with _released_on_error(release):
        for lock in locks:
            if not lock.acquire(wait=0):
                raise RuntimeError(f"{lock.name}: a free lock was not acquired")
    # The lease is "token|since|fence|owner record" (lease.py).
    pairs = [(lock_keys(lock.name, "default").lease, f"{lock.token}|".encode()) for lock in locks]
    return Held(locks, lambda admin: _count_matching(admin, pairs), release)


def hold_python_redis_lock(url: str, names: Sequence[str], lease: float) -> Held:
    import redis_lock

    # One client for every lock, on a pool where a renewal thread waits for a free connection:
    # redis-py's default pool (100 connections) raises MaxConnectionsError instead when more
    # threads than that renew at once, and the thread dies with its lock's renewal.
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=PRL_POOL, timeout=None)
    client = redis.Redis(connection_pool=pool)
    locks = [redis_lock.Lock(client, name, expire=int(lease), auto_renewal=True) for name in names]

    def release() -> None:
        for lock in locks:
            with contextlib.suppress(Exception):  # NotAcquired when not held or lost
                lock.release()

    with _released_on_error(release):
        for name, lock in zip(names, locks, strict=True):
            if not lock.acquire(blocking=False):
                raise RuntimeError(f"{name}: a free lock was not acquired")
    pairs = [(f"lock:{name}", lock.id.encode()) for name, lock in zip(names, locks, strict=True)]
    return Held(locks, lambda admin: _count_matching(admin, pairs), release)


HOLDERS: dict[str, Callable[[str, Sequence[str], float], Held]] = {
    OURS: hold_ours,
    PRL: hold_python_redis_lock,
}


# -- one measurement -----------------------------------------------------------------------


@dataclass
class Renewal:
    library: str
    locks: int
    acquire_s: float = 0.0  # taking all N, before the window
    window_s: float = 0.0
    cpu_share: float = 0.0  # of one core, this process, all threads
    renewals: int = 0  # leases renewed in the window (server: PEXPIRE / EXPIRE calls)
    script_calls: int = 0  # EVALSHA calls in the window
    round_trips: int = 0  # requests this process sent in the window
    server_cpu_share: float = 0.0
    lost_signals: int = 0  # lock_lost received (ours)
    thread_errors: dict[str, int] = field(default_factory=dict)  # exceptions in its threads
    still_held: int = 0  # leases still ours at the end
    error: str | None = None

    @property
    def renewals_per_s(self) -> float:
        return self.renewals / self.window_s if self.window_s else 0.0

    @property
    def cpu_us_per_renewal(self) -> float:
        return self.cpu_share * self.window_s * 1e6 / self.renewals if self.renewals else 0.0

    @property
    def cycles(self) -> float:
        """Renewal cycles in the window: every held lease renewed once is one."""
        return self.renewals / self.locks if self.locks else 0.0

    @property
    def round_trips_per_cycle(self) -> float:
        return self.round_trips / self.cycles if self.cycles else float("inf")

    @property
    def leases_per_round_trip(self) -> float:
        return self.renewals / self.round_trips if self.round_trips else 0.0

    @property
    def lost(self) -> int:
        """Locks lost: the larger of what the library said (signals, thread errors) and what
        the end check found."""
        said = self.lost_signals + sum(self.thread_errors.values())
        return max(said, self.locks - self.still_held)


def _commands(admin: redis.Redis, *names: str) -> dict[str, int]:
    calls = command_calls(admin)
    return {name: calls.get(name, 0) for name in names}


@contextlib.contextmanager
def _thread_errors(errors: collections.Counter[str]) -> Iterator[None]:
    """Count (instead of printing) the exceptions that end threads meanwhile: a
    python-redis-lock renewal thread dies of ``NotAcquired`` when its lease was gone."""
    previous = threading.excepthook

    def hook(args: Any) -> None:
        errors[args.exc_type.__name__ if args.exc_type else "?"] += 1

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


def _delete_new_keys(admin: redis.Redis, existing: set[bytes]) -> None:
    new = [key for key in admin.scan_iter(count=1000) if key not in existing]
    for start in range(0, len(new), 1000):
        admin.delete(*new[start : start + 1000])


def warm_up(library: str, url: str, params: Params) -> None:
    """Hold two locks through their first renewal, so that the renewal script is in the
    server's script cache before the window (the first renewal of a fresh server finds it
    missing: NOSCRIPT, SCRIPT LOAD, again: two more round trips, once per server). Two: ours
    renews a lone lease with extend.lua, several with extend_many.lua."""
    admin = redis.Redis.from_url(url, connection_class=WorkConnection)
    existing = set(admin.scan_iter(count=1000))
    held = HOLDERS[library](url, ["renew:warm-up:1", "renew:warm-up:2"], params.lease)
    try:
        time.sleep(params.lease * 2 / 3 + 0.3)  # ours renews at 1/3 of the lease, it at 2/3
        if held.still_ours(admin) != 2:
            raise RuntimeError("a warm-up lock was lost")
    finally:
        held.release()
        _delete_new_keys(admin, existing)


def measure(library: str, url: str, count: int, params: Params) -> Renewal:
    from django_redis_lock import lock_lost

    # The harness' own client: its connections are counted apart ("work"), and it is only
    # used outside the window anyway.
    admin = redis.Redis.from_url(url, connection_class=WorkConnection)
    result = Renewal(library, count)
    existing = set(admin.scan_iter(count=1000))
    lost: list[str] = []

    def on_lost(sender: Any, **kwargs: Any) -> None:
        lost.append(str(kwargs.get("name")))

    errors: collections.Counter[str] = collections.Counter()
    held: Held | None = None
    lock_lost.connect(on_lost, weak=False)
    try:
        with _thread_errors(errors):
            gc.collect()
            began = time.monotonic()
            held = HOLDERS[library](url, [f"renew:{i}" for i in range(count)], params.lease)
            result.acquire_s = time.monotonic() - began
            # The window: from here on this thread only sleeps.
            commands_before = _commands(admin, RENEWED_BY[library], "evalsha")
            server_before = server_cpu(admin)
            counter = RequestCounter().install()
            cpu_before, started = time.process_time(), time.monotonic()
            time.sleep(params.window)
            cpu, elapsed = time.process_time() - cpu_before, time.monotonic() - started
            counter.uninstall()
            result.server_cpu_share = (server_cpu(admin) - server_before) / elapsed
            commands_after = _commands(admin, RENEWED_BY[library], "evalsha")
            result.window_s = elapsed
            result.cpu_share = cpu / elapsed
            result.round_trips = counter.counts["lock"]
            renewed = RENEWED_BY[library]
            result.renewals = commands_after[renewed] - commands_before[renewed]
            result.script_calls = commands_after["evalsha"] - commands_before["evalsha"]
            result.still_held = held.still_ours(admin)
            result.lost_signals = len(lost)
            result.thread_errors = dict(errors)
            held.release()  # still counting (not printing) the threads' exceptions
            held = None
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        lock_lost.disconnect(on_lost)
        if held is not None:
            held.release()
        _delete_new_keys(admin, existing)
        del held
        gc.collect()
    return result


# -- report --------------------------------------------------------------------------------


@dataclass
class Results:
    params: Params
    machine: dict[str, str]
    skipped: dict[str, str]  # library -> why n/a
    runs: list[Renewal] = field(default_factory=list)
    seconds: float = 0.0


def _percent(share: float) -> str:
    return f"{share * 100:.1f} %"


def renewal_table(results: Results) -> list[str]:
    header = [
        "library",
        "locks",
        "acquire all s",
        "CPU (% of a core)",
        "renewals/s",
        "client CPU µs/renewal",
        "round trips per renewal cycle",
        "leases per round trip",
        "script calls (EVALSHA)",
        "Redis server CPU",
        "locks lost",
    ]
    rows = []
    for library, reason in results.skipped.items():
        rows.append(na_row(TITLES[library], reason, len(header)))
    for r in results.runs:
        title = TITLES[r.library]
        if r.error:
            rows.append([title, f"{r.locks:,}", f"error: {r.error}", *[""] * 8])
            continue
        said = f"{r.lost_signals} signalled" if r.library == OURS else ""
        if r.thread_errors:
            errors = sorted(r.thread_errors.items())
            said = ", ".join(f"{n} {name} in threads" for name, n in errors)
        lost = f"{r.lost} ({said + '; ' if said else ''}{r.locks - r.still_held} gone at the end)"
        rows.append(
            [
                title,
                f"{r.locks:,}",
                fmt(r.acquire_s, 2),
                _percent(r.cpu_share),
                fmt(r.renewals_per_s),
                fmt(r.cpu_us_per_renewal, 1),
                fmt(r.round_trips_per_cycle, 2),
                fmt(r.leases_per_round_trip, 1),
                f"{r.script_calls:,}",
                _percent(r.server_cpu_share),
                lost,
            ]
        )
    return md_table(header, rows)


@dataclass(frozen=True)
class Target:
    what: str
    goal: str
    counts: tuple[int, ...] | None  # the N it is checked at (None: every N)
    check: Callable[[Renewal], tuple[str, bool]]


TARGETS = (
    Target(
        "CPU of the holding process",
        "≤ 10 % of a core at 10,000 locks",
        (10000,),
        lambda r: (_percent(r.cpu_share), r.cpu_share <= 0.10),
    ),
    Target(
        "leases renewed per round trip (at most one round trip per 100 leases per cycle)",
        "≥ 100",
        None,
        lambda r: (
            f"{r.leases_per_round_trip:,.1f} ({r.round_trips_per_cycle:.2f} round trips per "
            "cycle)",
            r.leases_per_round_trip >= 100,
        ),
    ),
    Target("locks lost", "0", None, lambda r: (str(r.lost), r.lost == 0)),
)


def targets_table(results: Results) -> list[str]:
    counts = sorted(set(FULL.counts) | set(results.params.counts))
    header = ["target", "goal", *(f"ours, {n:,} locks" for n in counts)]
    ours = {r.locks: r for r in results.runs if r.library == OURS}
    rows = []
    for target in TARGETS:
        cells = [target.what, target.goal]
        for n in counts:
            run = ours.get(n)
            if target.counts is not None and n not in target.counts:
                cells.append("(goal set at another N)")
            elif run is None or OURS in results.skipped:
                cells.append("not measured")
            elif run.error:
                cells.append(f"❌ error: {run.error}")
            else:
                detail, met = target.check(run)
                cells.append(f"{'✅ met' if met else '❌ missed'}: {detail}")
        rows.append(cells)
    return md_table(header, rows)


def render(results: Results) -> str:
    p = results.params
    prl_note = ""
    if set(p.others_counts) != set(p.counts):
        prl_note = (
            " python-redis-lock is measured with "
            + ", ".join(f"{n:,}" for n in p.others_counts)
            + " locks only."
        )
    lines = heading(": renewal at scale", "bench_renewal.py", results.seconds, results.machine)
    lines += [
        "",
        "## Holding N auto-renewed locks in one process",
        "",
        f"One process takes N locks (lease {p.lease:g} s, renewed in the background) and "
        f"holds them all through a window of {p.window:g} s that starts once the last one is "
        "taken; `acquire all` is the time that took, before the window. CPU: the process "
        "(`time.process_time()`, every thread) over the window, as a share of one core. "
        "Renewals: leases renewed in the window, counted by the server (`INFO commandstats`: "
        "`PEXPIRE` for ours, run once per renewed lease by `extend_many.lua`; `EXPIRE` for "
        "python-redis-lock, once per renewed lease by its extend script). Round trips: "
        "requests the process sent in the window (wrapped `send_packed_command`; a pipeline "
        "is one). A renewal cycle is one renewal of every held lease: round trips per cycle "
        "= round trips x N / renewals. Locks lost: the larger of what the library reported "
        "(ours: `lock_lost` signals; python-redis-lock: exceptions that ended its renewal "
        "threads) and the leases that no longer held our token at the end of the window. "
        f"python-redis-lock's locks share one client on a blocking pool of {PRL_POOL} "
        "connections. Before each library's first N, two of its locks are held through "
        "their first renewal (renewal script loaded)." + prl_note,
        "",
    ]
    lines += renewal_table(results)
    notes = [
        f"- {TITLES[r.library].split(':')[0]} could not hold {r.locks:,} locks: taking them "
        f"took {r.acquire_s:.1f} s (the lease is {p.lease:g} s) and {r.lost:,} were lost "
        "by the end of the window."
        for r in results.runs
        if not r.error and r.lost
    ]
    if notes:
        lines += ["", *notes]
    lines += ["", "## Targets for django-redis-lock", ""]
    lines += targets_table(results)
    lines.append("")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 locks only, 4 s windows")
    parser.add_argument("--output", type=Path, default=HERE / "results-renewal.md")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    params = QUICK if args.quick else FULL
    skipped = {}
    for library, variant in ((OURS, "ours"), (PRL, "python_redis_lock")):
        reason = unavailable_reason(VARIANT_BY_KEY[variant])
        if reason is not None:
            skipped[library] = reason
            log(f"renewal: {library}: n/a ({reason})")
    began = time.monotonic()
    with private_redis() as url:
        configure_django(url)
        admin = redis.Redis.from_url(url)
        results = Results(params, describe_machine(admin), skipped)
        plan = [(OURS, n) for n in params.counts] + [(PRL, n) for n in params.others_counts]
        warm: set[str] = set()
        for library, count in plan:
            if library in skipped:
                continue
            if library not in warm:
                log(f"renewal: {library}, warm-up")
                warm_up(library, url, params)
                warm.add(library)
            log(f"renewal: {library}, {count:,} locks")
            run = measure(library, url, count, params)
            results.runs.append(run)
            if run.error:
                log(f"renewal: {library}, {count:,} locks: {run.error}")
    results.seconds = time.monotonic() - began
    report = render(results)
    args.output.write_text(report)
    print(report)
    log(f"renewal: done in {results.seconds:.0f} s; written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
