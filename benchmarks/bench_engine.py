"""Engine v2's goals, measured with every compared library side by side in one run.

    .venv/bin/python benchmarks/bench_engine.py [--quick] [--output PATH]

One private redis-server (``bench.private_redis``), and ``bench.py``'s own measurements
reused, so the figures mean the same as in ``results.md``:

1. uncontended acquire + release (``bench.measure_uncontended``);
2. 6 contending processes (``bench.run_contended``), plus the Redis commands per acquisition
   counted by the server (``INFO commandstats``: a script's own ``redis.call``s count, and so
   does the ``EVALSHA``), less the critical section's 4;
3. 24 contending processes, the same way;
4. bytes per held lock: ``used_memory`` with 5,000 locks held at once, less before, / 5,000;
5. renewal at scale: one process holds N auto-renewed locks (lease 3 s) for a window; its CPU
   (all threads) as a share of one core, and the round trips it sent (wrapped
   ``send_packed_command``: a pipeline is one) per renewal cycle.

Results go to ``benchmarks/results-engine.md`` (and stdout), with the issue's targets.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
for path in (str(HERE.parent), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

import bench  # noqa: E402

COMPARED = ("ours", "ours_t10", "redis_py_fast", "python_redis_lock", "raw")
# Commands the harness itself sends (stats, set-up), never the locks': left out of the count.
_HARNESS = ("info", "config", "ping", "hello", "client", "select", "flushdb", "script")


@dataclass(frozen=True)
class EngineParams:
    bench: bench.Params
    crowd: int = 24  # workers in the crowded contended run
    held: int = 5000  # locks held at once for the memory row
    renewal_counts: tuple[int, ...] = (1000, 10000)
    renewal_window: float = 10.0


FULL = EngineParams(bench.Params(seconds=5.0), renewal_counts=(1000, 10000))
QUICK = EngineParams(
    bench.Params(cycles=1000, warmup=100, rounds=5, seconds=1.5),
    held=2000, renewal_counts=(1000,), renewal_window=4.0,
)  # fmt: skip


def _commands(admin: redis.Redis) -> int:
    stats = admin.info("commandstats")
    return sum(
        int(value["calls"])
        for name, value in stats.items()
        if name.removeprefix("cmdstat_").split("|")[0] not in _HARNESS
    )


@dataclass
class Contention:
    result: bench.Contended
    commands: float = 0.0  # per acquisition, Lua included, critical section excluded


def contended(ctx: Any, variant: bench.Variant, url: str, params: bench.Params) -> Contention:
    admin = redis.Redis.from_url(url)
    before = _commands(admin)
    result = bench.run_contended(ctx, variant, url, params)
    total = _commands(admin) - before
    if result.error or not result.acquisitions:
        return Contention(result)
    # The critical section sends 4 per acquisition, each worker's warm-up cycle 1 + a PING.
    lock_commands = total - 4 * result.acquisitions - 2 * params.workers
    return Contention(result, lock_commands / result.acquisitions)


# -- memory per held lock --------------------------------------------------------------------


def _used_memory(admin: redis.Redis) -> float:
    return statistics.median(int(admin.info("memory")["used_memory"]) for _ in range(3))


class _RawHeld:
    """The raw floor's lease: SET NX PX of a random token; released with a plain DEL here."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client, self.name = client, name

    def acquire(self) -> bool:
        token = secrets.token_hex(16)
        return bool(self.client.set(self.name, token, nx=True, px=60_000))

    def release(self) -> None:
        self.client.delete(self.name)


def memory_per_lock(url: str, count: int) -> dict[str, float | str]:
    """Bytes of Redis memory per held lock, per library (and ours with every option)."""
    from django_redis_lock import Lock

    admin = redis.Redis.from_url(url)
    # Every library on one shared client (one connection's buffers, not one per lock): what is
    # measured is the keys. redis-py's and the raw floor's token: 32 hex characters, as theirs.
    client = redis.Redis.from_url(url)
    makers: dict[str, Any] = {
        "ours": lambda i: Lock(f"mem:{i}", timeout=60),
        "ours_all": lambda i: Lock(
            f"mem:{i}", timeout=60, fencing=True, reentrant=True, label="nightly invoice run"
        ),
        "redis_py_fast": lambda i: client.lock(f"mem:{i}", timeout=60),
        "raw": lambda i: _RawHeld(client, f"mem:{i}"),
    }
    if bench.unavailable_reason(bench.VARIANT_BY_KEY["python_redis_lock"]) is None:
        import redis_lock

        makers["python_redis_lock"] = lambda i: redis_lock.Lock(client, f"mem:{i}", expire=60)
    results: dict[str, float | str] = {}
    for key, make in makers.items():
        admin.flushdb()
        gc.collect()
        before = _used_memory(admin)
        held = [make(i) for i in range(count)]
        for lock in held:
            if not lock.acquire():
                results[key] = "a free lock was not acquired"
                break
        else:
            results[key] = (_used_memory(admin) - before) / count
        for lock in held:
            with contextlib.suppress(Exception):
                lock.release()
        admin.flushdb()
    return results


# -- renewal at scale ------------------------------------------------------------------------


@dataclass
class Renewal:
    locks: int
    cpu_share: float = 0.0  # of one core, this process, all threads
    renewals_per_s: float = 0.0
    cpu_us_per_renewal: float = 0.0
    round_trips_per_cycle: float = 0.0
    leases_per_round_trip: float = 0.0
    server_cpu_share: float = 0.0
    lost: int = 0
    error: str | None = None


def renewal_at_scale(url: str, count: int, window: float, library: str) -> Renewal:
    """``count`` locks (lease 3 s, renewed) held by this process through ``window`` seconds."""
    from django_redis_lock import Lock, lock_lost

    admin = redis.Redis.from_url(url)
    admin.flushdb()
    lost: list[str] = []

    def on_lost(sender: Any, **kwargs: Any) -> None:
        lost.append(kwargs["name"])

    lock_lost.connect(on_lost, weak=False)
    held: list[Any] = []
    try:
        if library == "ours":
            held = [Lock(f"renew:{i}", timeout=3, auto_renew=True) for i in range(count)]
            for lock in held:
                lock.acquire(wait=0)
        else:
            import redis_lock

            client = redis.Redis.from_url(url)
            held = [
                redis_lock.Lock(client, f"renew:{i}", expire=3, auto_renewal=True)
                for i in range(count)
            ]
            for lock in held:
                lock.acquire(blocking=False)
        time.sleep(1.0)  # settle: the first renewals after the acquisitions
        server_before = bench.server_cpu(admin)
        evals_before = _renewal_calls(admin)
        counter = bench.RequestCounter().install()
        cpu_before, started = time.process_time(), time.monotonic()
        time.sleep(window)
        cpu, elapsed = time.process_time() - cpu_before, time.monotonic() - started
        counter.uninstall()
        renewals = _renewal_calls(admin) - evals_before
        server = bench.server_cpu(admin) - server_before
        round_trips = counter.counts["lock"]
        cycles = elapsed / 1.0  # a 3 s lease is renewed every second
        result = Renewal(
            locks=count,
            cpu_share=cpu / elapsed,
            renewals_per_s=renewals / elapsed,
            cpu_us_per_renewal=cpu * 1e6 / max(1, renewals),
            round_trips_per_cycle=round_trips / cycles,
            leases_per_round_trip=renewals / max(1, round_trips),
            server_cpu_share=server / elapsed,
            lost=len(lost),
        )
    except Exception as exc:  # a library that cannot hold this many: say so
        result = Renewal(locks=count, error=f"{type(exc).__name__}: {exc}")
    finally:
        lock_lost.disconnect(on_lost)
        for lock in held:
            with contextlib.suppress(Exception):
                lock.release()
        admin.flushdb()
    return result


def _renewal_calls(admin: redis.Redis) -> int:
    """Leases renewed so far: every PEXPIRE (ours: one per lease in extend_many.lua) or
    EXPIRE (python-redis-lock's renewal script)."""
    stats = admin.info("commandstats")
    return sum(
        int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_pexpire", "cmdstat_expire")
    )


# -- report ----------------------------------------------------------------------------------


@dataclass
class EngineResults:
    params: EngineParams
    machine: dict[str, str]
    ping: bench.Ping = field(default_factory=bench.Ping)
    uncontended: dict[str, bench.Uncontended] = field(default_factory=dict)
    six: dict[str, Contention] = field(default_factory=dict)
    crowd: dict[str, Contention] = field(default_factory=dict)
    memory: dict[str, float | str] = field(default_factory=dict)
    renewal: list[tuple[str, Renewal]] = field(default_factory=list)
    seconds: float = 0.0


def _title(key: str) -> str:
    if key == "ours_all":
        return 'ours: `Lock(name, fencing=True, reentrant=True, label="nightly invoice run")`'
    return bench.VARIANT_BY_KEY[key].title


def contended_rows(runs: dict[str, Contention]) -> list[str]:
    header = [
        "library", "acq/s", "handoff p50 ms", "handoff p99 ms", "wait p50 ms", "wait p99 ms",
        "Jain", "lock round trips/acq", "Redis commands/acq (Lua incl.)", "server CPU µs/acq",
        "overlaps", "lost updates",
    ]  # fmt: skip
    rows = []
    for key, run in runs.items():
        r = run.result
        if r.error:
            rows.append([_title(key), f"error: {r.error}"] + [""] * (len(header) - 2))
            continue
        rows.append([
            _title(key), bench._f(r.per_second), bench._f(r.handoff_median_ms, 3),
            bench._f(r.handoff_p99_ms, 3), bench._f(r.wait_median_ms, 2),
            bench._f(r.wait_p99_ms, 2), f"{r.jain:.3f}", f"{r.lock_requests:.2f}",
            f"{run.commands:.1f}", bench._f(r.server_cpu_us, 1), str(r.overlaps),
            str(r.lost_updates),
        ])  # fmt: skip
    return bench._table(header, rows)


def targets(results: EngineResults) -> list[str]:
    def get(runs: dict[str, Contention], key: str) -> bench.Contended | None:
        run = runs.get(key)
        return None if run is None or run.result.error else run.result

    rows: list[list[str]] = []

    def check(goal: str, row: str, value: str, met: bool) -> None:
        rows.append([goal, row, value, "✅ met" if met else "❌ missed"])

    raw = get(results.six, "raw")
    raw_u = results.uncontended.get("raw")
    for key in ("ours", "ours_t10"):
        title = _title(key)
        six = get(results.six, key)
        if six and raw:
            ratio = six.per_second / raw.per_second
            check(
                "acq/s ≥ 0.95 x raw",
                title,
                f"{six.per_second:.0f} vs {raw.per_second:.0f} = {ratio:.2f}x",
                ratio >= 0.95,
            )
        if six:
            check("Jain ≥ 0.99", title, f"{six.jain:.3f}", six.jain >= 0.99)
            check(
                "handoff p99 ≤ 0.6 ms",
                title,
                f"{six.handoff_p99_ms:.3f} ms",
                six.handoff_p99_ms <= 0.6,
            )
            check("wait p99 ≤ 8 ms", title, f"{six.wait_p99_ms:.2f} ms", six.wait_p99_ms <= 8)
            check(
                "≤ 3 lock round trips/acq",
                title,
                f"{six.lock_requests:.2f}",
                six.lock_requests <= 3,
            )
            commands = results.six[key].commands
            check("≤ 20 Redis commands/acq", title, f"{commands:.1f}", commands <= 20)
            if raw:
                check(
                    "server CPU/acq ≤ raw's",
                    title,
                    f"{six.server_cpu_us:.0f} vs {raw.server_cpu_us:.0f} µs",
                    six.server_cpu_us <= raw.server_cpu_us,
                )
            check(
                "0 overlaps, 0 lost updates",
                title,
                f"{six.overlaps}, {six.lost_updates}",
                not six.overlaps and not six.lost_updates,
            )
        ours_u = results.uncontended.get(key)
        if ours_u and raw_u and not ours_u.error and not raw_u.error and raw_u.above_median_us > 0:
            ratio = ours_u.above_median_us / raw_u.above_median_us
            check(
                "uncontended - 2 RTT ≤ 1.3 x raw",
                title,
                f"{ours_u.above_median_us:.1f} vs {raw_u.above_median_us:.1f} µs = {ratio:.2f}x",
                ratio <= 1.3,
            )
        crowd, crowd_prl = get(results.crowd, key), get(results.crowd, "python_redis_lock")
        if crowd and crowd_prl:
            check(
                f"{results.params.crowd} processes: acq/s ≥ python-redis-lock's",
                title,
                f"{crowd.per_second:.0f} vs {crowd_prl.per_second:.0f}",
                crowd.per_second >= crowd_prl.per_second,
            )
        if crowd:
            check(
                f"{results.params.crowd} processes: Jain ≥ 0.99",
                title,
                f"{crowd.jain:.3f}",
                crowd.jain >= 0.99,
            )
    for key, bound in (("ours", 220), ("ours_all", 400)):
        value = results.memory.get(key)
        if isinstance(value, float):
            check(f"bytes per held lock ≤ {bound}", _title(key), f"{value:.0f} B", value <= bound)
    for library, run in results.renewal:
        if library == "ours" and run.locks == 10000 and not run.error:
            check(
                "10,000 renewed locks ≤ 10 % of a core",
                "ours",
                f"{run.cpu_share * 100:.1f} %",
                run.cpu_share <= 0.10,
            )
            check(
                "≥ 100 leases per round trip",
                "ours",
                f"{run.leases_per_round_trip:.0f}",
                run.leases_per_round_trip >= 100,
            )
            check("no lock lost while renewing", "ours", str(run.lost), run.lost == 0)
    return bench._table(["goal", "row", "measured", ""], rows)


def render(results: EngineResults) -> str:
    p = results.params
    lines = [
        "# django-redis-lock engine benchmark: the engine v2 goals",
        "",
        f"Written by `benchmarks/bench_engine.py` (`make bench`) in {results.seconds:.0f} s. "
        "Every figure of this file comes from the same run, on one private redis-server; "
        "`benchmarks/README.md` says what each number means.",
        "",
        "## Machine",
        "",
    ]
    lines += [f"- **{name}**: {value}" for name, value in results.machine.items()]
    lines += [
        "",
        "## Uncontended acquire + release",
        "",
        f"As in `results.md`. PING round trip in this run: **{results.ping.rtt_us:.1f} µs**.",
        "",
    ]
    rows = []
    for key, u in results.uncontended.items():
        if u.error:
            rows.append([_title(key), f"error: {u.error}", "", "", ""])
        else:
            rows.append([_title(key), bench._f(u.median_us, 1), bench._f(u.above_median_us, 1),
                         bench._f(u.client_cpu_us, 1), f"{u.requests:.2f}"])  # fmt: skip
    lines += bench._table(
        [
            "library",
            "cycle median µs",
            "median - 2 RTT µs",
            "client CPU µs/cycle",
            "requests/cycle",
        ],
        rows,
    )
    lines += [
        "",
        f"## {p.bench.workers} contending processes",
        "",
        f"As in `results.md` ({p.bench.seconds:g} s, critical section: 4 round trips and "
        f"{p.bench.critical_section * 1000:g} ms of sleep), plus the commands the server ran "
        "per acquisition, Lua's own included, the critical section's 4 left out.",
        "",
    ]
    lines += contended_rows(results.six)
    lines += ["", f"## {p.crowd} contending processes", "", "The same, with more processes than "
              "the 2 cores can run at once.", ""]  # fmt: skip
    lines += contended_rows(results.crowd)
    lines += [
        "",
        "## Bytes per held lock",
        "",
        f"Redis `used_memory` with {p.held:,} locks "
        "held at once (lease 60 s, not renewed), less before, divided by their number.",
        "",
    ]
    lines += bench._table(
        ["library", "bytes per held lock"],
        [
            [_title(key), f"{value:.0f}" if isinstance(value, float) else str(value)]
            for key, value in results.memory.items()
        ],
    )
    lines += [
        "",
        "## Renewal at scale",
        "",
        f"One process holds N locks with a 3 s lease, "
        f"renewed in the background, for {p.renewal_window:g} s. CPU: that process, all "
        "threads, as a share of one core. Renewals: the leases' PEXPIREs (ours) or "
        "EXPIREs (python-redis-lock) the server ran. Round trips: requests the process "
        "sent (a pipeline is one); a renewal cycle is one second (a third of the lease).",
        "",
    ]
    rows = []
    for library, r in results.renewal:
        name = "ours" if library == "ours" else "python-redis-lock (a thread per lock)"
        if r.error:
            rows.append([name, f"{r.locks:,}", f"error: {r.error}"] + [""] * 6)
            continue
        rows.append(
            [
                name,
                f"{r.locks:,}",
                f"{r.cpu_share * 100:.1f} %",
                f"{r.renewals_per_s:,.0f}",
                f"{r.cpu_us_per_renewal:.1f}",
                f"{r.round_trips_per_cycle:.1f}",
                f"{r.leases_per_round_trip:.0f}",
                f"{r.server_cpu_share * 100:.1f} %",
                str(r.lost),
            ]
        )
    lines += bench._table(
        [
            "library",
            "locks",
            "CPU (one core)",
            "renewals/s",
            "client CPU µs/renewal",
            "round trips per cycle",
            "leases per round trip",
            "server CPU",
            "lost",
        ],
        rows,
    )
    lines += ["", "## Targets (engine v2 issue)", ""]
    lines += targets(results)
    lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, for a smoke test")
    parser.add_argument("--output", type=Path, default=HERE / "results-engine.md")
    args = parser.parse_args(argv)
    params = QUICK if args.quick else FULL
    variants = [bench.VARIANT_BY_KEY[key] for key in COMPARED]
    variants = [v for v in variants if bench.unavailable_reason(v) is None]
    began = time.monotonic()
    with bench.private_redis() as url:
        bench.configure_django(url)
        admin = redis.Redis.from_url(url)
        results = EngineResults(params, bench.describe_machine(admin))
        bench._log(f"engine: redis-server at {url}; uncontended cycles")
        results.ping, results.uncontended = bench.measure_uncontended(variants, url, params.bench)
        ctx = bench.process_context()
        for variant in variants:
            bench._log(f"engine: {params.bench.workers} contending: {variant.key}")
            results.six[variant.key] = contended(ctx, variant, url, params.bench)
        crowded = replace(params.bench, workers=params.crowd)
        for variant in variants:
            bench._log(f"engine: {params.crowd} contending: {variant.key}")
            results.crowd[variant.key] = contended(ctx, variant, url, crowded)
        bench._log("engine: bytes per held lock")
        results.memory = memory_per_lock(url, params.held)
        for count in params.renewal_counts:
            bench._log(f"engine: renewal of {count:,} locks, ours")
            results.renewal.append(
                ("ours", renewal_at_scale(url, count, params.renewal_window, "ours"))
            )
        if bench.unavailable_reason(bench.VARIANT_BY_KEY["python_redis_lock"]) is None:
            bench._log("engine: renewal of 1,000 locks, python-redis-lock")
            results.renewal.append(
                ("python_redis_lock", renewal_at_scale(url, 1000, params.renewal_window, "prl"))
            )
    results.seconds = time.monotonic() - began
    report = render(results)
    args.output.write_text(report)
    print(report)
    bench._log(f"engine: done in {results.seconds:.0f} s; written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
