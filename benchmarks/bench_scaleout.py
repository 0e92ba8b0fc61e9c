"""The lock on one server, on a Redis Cluster, and in quorum mode (3 servers), side by side.

    .venv/bin/python -m benchmarks.bench_scaleout [--quick] [--output PATH]
    .venv/bin/python -m benchmarks.bench_scaleout --profile 5000 [--profile-variant single]

Seven private ``redis-server`` processes (``EmbeddedRedis``, loopback): one on its own (cache
alias ``default``), three forming a Redis Cluster (3 primaries, slots split evenly, reached
through ``DJANGO_REDIS_LOCK_CONNECTION_FACTORY`` as alias ``cluster``), three independent ones
forming the quorum ``redlock`` (``DJANGO_REDIS_LOCK_QUORUMS``, cache aliases q0, q1, q2).

1. ``measure_uncontended``: one process; ``with Lock(name): pass`` (default lease: 30 s,
   renewed) and ``Lock(name, fencing=True)`` in each mode, next to each mode's floor:
   ``SET NX PX`` + ``DEL`` on one connection (single), through ``RedisCluster`` (cluster), sent
   to the three servers at once and then read from all three (quorum); and the lock's own
   take + release scripts, bare, on one server or sent to three at once (what quorum mode
   cannot do with less, whatever its client code). Every variant runs a block of cycles in
   each of many rounds, the order rotated from round to round, so a noisy neighbour hurts all
   alike; per-round medians give the spread, and ratios are taken within each round (paired)
   as well as on the pooled medians.
2. ``run_contended``: 4 processes fight for one lock in each mode, with a tiny critical section
   (INCR an overlap detector, GET + SET a counter, DECR: 4 round trips to the single server,
   no sleep); rounds again, modes interleaved. Handoff = another worker's acquisition minus the
   previous release (``harness.contention.summarize_contended``). In quorum mode a release
   wakes nobody: waiters look again after a random 5-30 ms (``quorum/``), so handoffs are
   slower.

Target (issue #7): quorum cycle at most 1.5x the single-server cycle. Results go to
``benchmarks/results-scaleout.md`` (and stdout). ``--profile N`` instead runs N cycles of one
variant (``--profile-variant``, default ``quorum``) under cProfile and prints the top costs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import gc
import io
import multiprocessing
import os
import platform
import pstats
import queue
import secrets
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness.contention import Contended, contend, stop_process, summarize_contended
from benchmarks.harness.machine import cpu_model, git
from benchmarks.harness.records import RequestCounter, WorkConnection, percentile, server_cpu
from benchmarks.harness.servers import EmbeddedRedis, start_cluster

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Params:
    cycles: int = 5000  # timed uncontended cycles per variant
    warmup: int = 300
    rounds: int = 25  # uncontended rounds (one block of cycles per variant each)
    workers: int = 4
    contended_rounds: int = 3  # each mode runs once per round
    seconds: float = 2.5  # one contended run
    wait: float = 10.0  # longest wait for one acquisition


FULL = Params()
QUICK = Params(cycles=600, warmup=100, rounds=6, contended_rounds=1, seconds=1.0)

MODES = ("single", "cluster", "quorum")
ALIAS = {"single": "default", "cluster": "cluster", "quorum": "redlock"}
QUORUM_MEMBERS = ("q0", "q1", "q2")
FLOOR_LEASE_MS = 30_000
TARGET_RATIO = 1.5


# -- servers -------------------------------------------------------------------------------


@dataclass
class Servers:
    single: Any
    cluster: list[Any]
    quorum: list[Any]

    def urls(self) -> dict[str, Any]:
        return {
            "single": self.single.url,
            "cluster": self.cluster[0].url,  # the startup node
            "quorum": [server.url for server in self.quorum],
        }

    def of_mode(self, mode: str) -> list[Any]:
        return {"single": [self.single], "cluster": self.cluster, "quorum": self.quorum}[mode]


def _start_cluster(started: list[Any]) -> list[Any]:
    """Three primaries in cluster mode, slots split evenly (as the tests' cluster)."""

    def start(**kwargs: Any) -> EmbeddedRedis:
        server = EmbeddedRedis(**kwargs).start()
        started.append(server)
        return server

    return start_cluster(3, start=start)


@contextlib.contextmanager
def private_servers() -> Iterator[Servers]:
    started: list[Any] = []
    try:
        single = EmbeddedRedis().start()
        started.append(single)
        cluster = _start_cluster(started)
        quorum = []
        for _ in QUORUM_MEMBERS:
            quorum.append(EmbeddedRedis().start())
            started.append(quorum[-1])
        yield Servers(single, cluster, quorum)
    finally:
        for server in reversed(started):
            server.stop()


# -- Django --------------------------------------------------------------------------------

_cluster_url: list[str] = []


def connection_factory(alias: str) -> Any:
    """``DJANGO_REDIS_LOCK_CONNECTION_FACTORY``: a RedisCluster for alias ``cluster``; for
    every other alias what the package takes without a factory (django-redis' primary)."""
    if alias == ALIAS["cluster"]:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(_cluster_url[0])
    from django_redis import get_redis_connection

    return get_redis_connection(alias, write=True)


def configure_django(urls: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    _cluster_url[:] = [urls["cluster"]]
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": urls["single"]}}
    for alias, url in zip(QUORUM_MEMBERS, urls["quorum"], strict=True):
        caches[alias] = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}
    settings.configure(
        INSTALLED_APPS=["django_redis_lock"],
        CACHES=caches,
        USE_TZ=True,
        DJANGO_REDIS_LOCK_QUORUMS={ALIAS["quorum"]: list(QUORUM_MEMBERS)},
        DJANGO_REDIS_LOCK_CONNECTION_FACTORY=connection_factory,
    )
    django.setup()


# -- 1. uncontended ------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    key: str
    mode: str
    title: str
    build: Callable[[dict[str, Any], str], Callable[[], None]]  # (urls, name) -> one cycle


def _lock_cycle(mode: str, fencing: bool) -> Callable[[dict[str, Any], str], Callable[[], None]]:
    def build(urls: dict[str, Any], name: str) -> Callable[[], None]:
        from django_redis_lock import Lock

        lock = Lock(name, using=ALIAS[mode], fencing=fencing)

        def cycle() -> None:
            with lock:
                pass

        return cycle

    return build


def _connections(urls: Sequence[str]) -> list[Any]:
    return [redis.Redis.from_url(url).connection_pool.get_connection() for url in urls]


def _floor_connections(mode: str) -> Callable[[dict[str, Any], str], Callable[[], None]]:
    """``SET NX PX`` + ``DEL``, each sent on all the connections at once, then read from all:
    one connection (single) or one to each of the quorum's three servers."""

    def build(urls: dict[str, Any], name: str) -> Callable[[], None]:
        connections = _connections(urls["quorum"] if mode == "quorum" else [urls["single"]])
        pack = connections[0].pack_command

        def cycle() -> None:
            taking = pack("SET", name, secrets.token_hex(16), "NX", "PX", FLOOR_LEASE_MS)
            for connection in connections:
                connection.send_packed_command(taking)
            replies = [connection.read_response() for connection in connections]  # read all
            if not all(replies):
                raise RuntimeError("a free key was not set")
            deleting = pack("DEL", name)
            for connection in connections:
                connection.send_packed_command(deleting)
            for connection in connections:
                connection.read_response()

        return cycle

    return build


# The lock's owner record, as Lock sends it (about this size): for the scripts floor.
_RECORD = "30000|12345|bench-host|MainThread|||bench:scaleout:scripts"


def _scripts_floor(mode: str) -> Callable[[dict[str, Any], str], Callable[[], None]]:
    """The scripts quorum mode runs, ``take.lua`` and ``release.lua``, by ``EVALSHA``, each
    sent on all the connections at once, then read from all; no lock logic around them. The
    arguments follow ``core/flows.py`` and ``core/release.py`` (each script documents them at
    its top): if they change, this row shows an error instead of a number."""

    def build(urls: dict[str, Any], name: str) -> Callable[[], None]:
        from django_redis_lock.backends.scripts import RELEASE, TAKE
        from django_redis_lock.primitives.keys import lock_keys

        connections = _connections(urls["quorum"] if mode == "quorum" else [urls["single"]])
        keys = lock_keys(name, ALIAS[mode])
        for connection in connections:
            for script in (TAKE, RELEASE):
                connection.send_packed_command(
                    connection.pack_command("SCRIPT", "LOAD", script.source)
                )
                connection.read_response()
        pack = connections[0].pack_command
        release_keys = keys.release_keys("")

        def cycle() -> None:
            token = secrets.token_hex(16)
            taking = pack("EVALSHA", TAKE.sha, 1, keys.lease, token, 30_000, _RECORD, "")
            for connection in connections:
                connection.send_packed_command(taking)
            replies = [connection.read_response() for connection in connections]  # read all
            if not all(reply[0] == 1 for reply in replies):
                raise RuntimeError(f"a free lock was not granted: {replies}")
            releasing = pack("EVALSHA", RELEASE.sha, len(release_keys), *release_keys, token, "")
            for connection in connections:
                connection.send_packed_command(releasing)
            for connection in connections:
                connection.read_response()

        return cycle

    return build


def _floor_client(mode: str) -> Callable[[dict[str, Any], str], Callable[[], None]]:
    """``SET NX PX`` + ``DEL`` through the client API: ``redis.Redis`` or ``RedisCluster``."""

    def build(urls: dict[str, Any], name: str) -> Callable[[], None]:
        if mode == "cluster":
            from redis.cluster import RedisCluster

            client: Any = RedisCluster.from_url(urls["cluster"])
        else:
            client = redis.Redis.from_url(urls["single"])

        def cycle() -> None:
            if not client.set(name, secrets.token_hex(16), nx=True, px=FLOOR_LEASE_MS):
                raise RuntimeError("a free key was not set")
            client.delete(name)

        return cycle

    return build


def _ping(urls: dict[str, Any], name: str) -> Callable[[], None]:
    connection = _connections([urls["single"]])[0]
    packed = connection.pack_command("PING")

    def cycle() -> None:
        connection.send_packed_command(packed)
        connection.read_response()

    return cycle


VARIANTS = (
    Variant("ping", "single", "`PING` on one connection (one round trip)", _ping),
    Variant("single", "single", "`Lock(name)`", _lock_cycle("single", False)),
    Variant("single_f", "single", "`Lock(name, fencing=True)`", _lock_cycle("single", True)),
    Variant("floor_single", "single", "floor: `SET NX PX` + `DEL`, one connection",
            _floor_connections("single")),
    Variant("scripts_single", "single", "floor: the lock's scripts, one connection",
            _scripts_floor("single")),
    Variant("floor_single_api", "single", "floor: `SET NX PX` + `DEL`, `redis.Redis` API",
            _floor_client("single")),
    Variant("cluster", "cluster", "`Lock(name)`", _lock_cycle("cluster", False)),
    Variant("cluster_f", "cluster", "`Lock(name, fencing=True)`", _lock_cycle("cluster", True)),
    Variant("floor_cluster", "cluster", "floor: `SET NX PX` + `DEL`, `RedisCluster` API",
            _floor_client("cluster")),
    Variant("quorum", "quorum", "`Lock(name)`", _lock_cycle("quorum", False)),
    Variant("quorum_f", "quorum", "`Lock(name, fencing=True)`", _lock_cycle("quorum", True)),
    Variant("floor_quorum", "quorum",
            "floor: `SET NX PX` to 3 at once, read 3; `DEL` likewise",
            _floor_connections("quorum")),
    Variant("scripts_quorum", "quorum",
            "floor: the lock's scripts to 3 at once, read 3", _scripts_floor("quorum")),
)  # fmt: skip
VARIANT_BY_KEY = {variant.key: variant for variant in VARIANTS}


@dataclass
class Uncontended:
    samples: list[float] = field(default_factory=list)  # µs per cycle, all rounds
    round_medians: list[float] = field(default_factory=list)
    client_cpu: float = 0.0  # seconds, this process
    server_cpu: float = 0.0  # seconds, the mode's servers together
    cycles: int = 0
    requests: float = 0.0  # per cycle, summed over servers
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p99(self) -> float:
        return percentile(self.samples, 0.99)


def _timed(cycle: Callable[[], None], count: int) -> list[float]:
    samples = []
    clock = time.perf_counter_ns
    for _ in range(count):
        started = clock()
        cycle()
        samples.append((clock() - started) / 1000)
    return samples


def _requests_per_cycle(cycle: Callable[[], None], count: int = 200) -> float:
    counter = RequestCounter().install()
    try:
        for _ in range(count):
            cycle()
    finally:
        counter.uninstall()
    return counter.counts["lock"] / count


def measure_uncontended(
    urls: dict[str, Any], servers: Servers, params: Params
) -> dict[str, Uncontended]:
    admins = {
        mode: [redis.Redis.from_url(server.url) for server in servers.of_mode(mode)]
        for mode in MODES
    }
    cycles: dict[str, Callable[[], None]] = {}
    results: dict[str, Uncontended] = {}
    for variant in VARIANTS:
        result = results[variant.key] = Uncontended()
        try:
            cycle = variant.build(urls, f"bench:scaleout:{variant.key}:{variant.mode}")
            _timed(cycle, params.warmup)  # connect, load scripts, warm caches
            result.requests = _requests_per_cycle(cycle)
            cycles[variant.key] = cycle
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
    block = max(1, params.cycles // params.rounds)
    order = list(cycles)
    for round_index in range(params.rounds):
        shift = round_index % len(order)
        for key in order[shift:] + order[:shift]:  # rotated: nobody always runs first
            result = results[key]
            if result.error:
                continue
            mode_admins = admins[VARIANT_BY_KEY[key].mode]
            gc.collect()
            server_before = sum(server_cpu(admin) for admin in mode_admins)
            client_before = time.process_time()
            try:
                samples = _timed(cycles[key], block)
            except Exception as exc:
                result.error = f"{type(exc).__name__}: {exc}"
                continue
            result.client_cpu += time.process_time() - client_before
            result.server_cpu += sum(server_cpu(admin) for admin in mode_admins) - server_before
            result.samples += samples
            result.round_medians.append(statistics.median(samples))
            result.cycles += block
    return results


# -- 2. contended --------------------------------------------------------------------------


def _cs_keys(mode: str) -> tuple[str, str]:
    return f"bench:scaleout:cs:{mode}:counter", f"bench:scaleout:cs:{mode}:inside"


def contended_worker(
    urls: dict[str, Any], mode: str, worker: int, params: Params, ready: Any, go: Any, out: Any
) -> None:
    """One contending process (``harness.contention.contend``, critical section without
    sleep). Sends back (worker, report) on ``out``."""
    try:
        configure_django(urls)
        from django_redis_lock import Lock

        lock = Lock(f"bench:scaleout:contended:{mode}", wait=params.wait, using=ALIAS[mode])
        work = redis.Redis.from_url(urls["single"], connection_class=WorkConnection)
        report = contend(lock, work, _cs_keys(mode), params.seconds, 0, ready, go)
        out.put((worker, report))
    except BaseException as exc:
        out.put((worker, {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}))


def process_context() -> Any:
    """forkserver, as bench.py: each worker is a fork of a clean process that has imported
    the libraries, and inherits nothing of this one's connections or threads."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["django", "django.core.cache", "redis", "django_redis_lock"])
    return ctx


def run_contended(
    ctx: Any, urls: dict[str, Any], servers: Servers, mode: str, params: Params
) -> Contended:
    work = redis.Redis.from_url(urls["single"])
    admins = [redis.Redis.from_url(server.url) for server in servers.of_mode(mode)]
    counter_key, inside_key = _cs_keys(mode)
    work.set(counter_key, 0)
    work.delete(inside_key)
    ready = ctx.Barrier(params.workers + 1)
    go = ctx.Event()
    out = ctx.Queue()
    processes = [
        ctx.Process(
            target=contended_worker,
            args=(urls, mode, worker, params, ready, go, out),
            name=f"bench-scaleout-{mode}-{worker}",
        )
        for worker in range(params.workers)
    ]
    for process in processes:
        process.start()
    reports: dict[int, dict[str, Any]] = {}
    try:
        with contextlib.suppress(Exception):  # a worker that failed to start breaks it
            ready.wait(timeout=120)
        cpu_before = sum(server_cpu(admin) for admin in admins)
        go.set()
        give_up = time.monotonic() + params.seconds + params.wait + 60
        while len(reports) < params.workers and time.monotonic() < give_up:
            with contextlib.suppress(queue.Empty):
                worker, report = out.get(timeout=1)
                reports[worker] = report
        cpu_seconds = sum(server_cpu(admin) for admin in admins) - cpu_before
    finally:
        for process in processes:
            stop_process(process)
    errors = [report["error"] for report in reports.values() if "error" in report]
    if errors or len(reports) < params.workers:
        missing = params.workers - len(reports)
        detail = errors[0].splitlines()[0] if errors else f"{missing} worker(s) never reported"
        print(errors[0] if errors else detail, file=sys.stderr)
        return Contended(error=detail)
    return summarize_contended(reports, cpu_seconds, int(work.get(counter_key) or 0))


# -- the machine ---------------------------------------------------------------------------


def describe_machine(single_url: str) -> dict[str, str]:
    import django

    version = redis.Redis.from_url(single_url).info("server")["redis_version"]
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", "django_redis_lock"):
        commit += " + uncommitted changes in django_redis_lock/"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "CPU": cpu_model(),
        "cores": str(os.cpu_count()),
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "redis-server": f"{version}, 7 private processes on loopback TCP (1 + 3 + 3)",
        "libraries": f"redis-py {redis.__version__}, Django {django.get_version()}",
        "django-redis-lock commit": commit,
        "load average at start": ", ".join(f"{value:.2f}" for value in os.getloadavg()),
    }


# -- report --------------------------------------------------------------------------------


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(row) for row in rows)]


def _spread(values: Sequence[float], digits: int = 0) -> str:
    if not values:
        return "n/a"
    return f"{min(values):,.{digits}f}-{max(values):,.{digits}f}"


@dataclass(frozen=True)
class Ratio:
    what: str
    top: str
    bottom: str
    target: float | None = None


RATIOS = (
    Ratio("quorum / single, `Lock(name)`", "quorum", "single", TARGET_RATIO),
    Ratio("quorum / single, `Lock(name, fencing=True)`", "quorum_f", "single_f"),
    Ratio("quorum `Lock(name)` / quorum floor", "quorum", "floor_quorum"),
    Ratio("quorum floor / single floor (one connection)", "floor_quorum", "floor_single"),
    Ratio("quorum scripts floor / single scripts floor", "scripts_quorum", "scripts_single"),
    Ratio("quorum `Lock(name)` / quorum scripts floor", "quorum", "scripts_quorum"),
    Ratio("single `Lock(name)` / single scripts floor", "single", "scripts_single"),
    Ratio("single `Lock(name)` / single floor (one connection)", "single", "floor_single"),
    Ratio("cluster / single, `Lock(name)`", "cluster", "single"),
    Ratio("cluster `Lock(name)` / cluster floor", "cluster", "floor_cluster"),
    Ratio("cluster floor / single floor (`redis.Redis` API)", "floor_cluster", "floor_single_api"),
)


def _ratio(results: dict[str, Uncontended], ratio: Ratio) -> tuple[float, list[float]] | None:
    top, bottom = results.get(ratio.top), results.get(ratio.bottom)
    if not top or not bottom or top.error or bottom.error or not top.samples:
        return None
    paired = [a / b for a, b in zip(top.round_medians, bottom.round_medians, strict=False)]
    return top.median / bottom.median, paired


@dataclass
class Results:
    params: Params
    machine: dict[str, str]
    uncontended: dict[str, Uncontended] = field(default_factory=dict)
    contended: dict[str, list[Contended]] = field(default_factory=dict)
    seconds: float = 0.0


def uncontended_table(results: Results) -> list[str]:
    header = [
        "mode", "what", "cycle median µs", "cycle p99 µs", "round medians µs (min-max)",
        "requests/cycle (all servers)", "client CPU µs/cycle", "server CPU µs/cycle",
    ]  # fmt: skip
    rows = []
    for variant in VARIANTS:
        r = results.uncontended.get(variant.key)
        if r is None:
            continue
        if r.error or not r.samples:
            rows.append([variant.mode, variant.title, f"n/a: {r.error}", "", "", "", "", ""])
            continue
        rows.append(
            [
                variant.mode,
                variant.title,
                f"{r.median:,.1f}",
                f"{r.p99:,.1f}",
                _spread(r.round_medians),
                f"{r.requests:.2f}",
                f"{r.client_cpu * 1e6 / r.cycles:,.1f}",
                f"{r.server_cpu * 1e6 / r.cycles:,.1f}",
            ]
        )
    return _table(header, rows)


def ratio_table(results: Results) -> list[str]:
    rows = []
    for ratio in RATIOS:
        measured = _ratio(results.uncontended, ratio)
        if measured is None:
            rows.append([ratio.what, "n/a", "", ""])
            continue
        pooled, paired = measured
        verdict = ""
        if ratio.target is not None:
            met = pooled <= ratio.target
            verdict = f"{'✅ met' if met else '❌ missed'} (≤ {ratio.target:g}x)"
        rows.append([ratio.what, f"{pooled:.2f}x", _spread(paired, 2), verdict])
    bound = _best_quorum_ratio(results.uncontended)
    if bound is not None:
        pooled, paired = bound
        rows.append(
            [
                "bound: (single `Lock(name)` + quorum scripts floor - single scripts floor) / "
                "single `Lock(name)`, a quorum client adding nothing to the bare scripts",
                f"{pooled:.2f}x",
                _spread(paired, 2),
                "",
            ]
        )
    return _table(["ratio of cycle medians", "pooled", "per round (min-max)", "target"], rows)


def _best_quorum_ratio(results: dict[str, Uncontended]) -> tuple[float, list[float]] | None:
    """The quorum/single ratio if quorum mode cost only what sending the lock's scripts to
    three servers instead of one costs here (the scripts floors' difference)."""
    parts = [results.get(key) for key in ("single", "scripts_single", "scripts_quorum")]
    measured = [part for part in parts if part is not None and not part.error and part.samples]
    if len(measured) < len(parts):
        return None
    single, one, three = measured

    def bound(lock: float, one_server: float, three_servers: float) -> float:
        return (lock + three_servers - one_server) / lock

    paired = [
        bound(*medians)
        for medians in zip(
            single.round_medians, one.round_medians, three.round_medians, strict=False
        )
    ]
    return bound(single.median, one.median, three.median), paired


def contended_table(results: Results) -> list[str]:
    header = [
        "mode", "acq/s", "handoffs", "handoff p50 ms", "handoff p99 ms", "same worker again",
        "Jain", "wait p99 ms", "wait max ms", "lock requests/acq (all servers)",
        "server CPU µs/acq", "overlaps", "lost updates", "timeouts",
    ]  # fmt: skip
    rows = []
    for mode in MODES:
        runs = results.contended.get(mode, [])
        good = [run for run in runs if not run.error]
        failed = [run.error for run in runs if run.error]
        if not good:
            rows.append([mode, f"n/a: {failed[0] if failed else 'not run'}", *[""] * 12])
            continue

        def med(attribute: str, digits: int, runs: list[Contended] = good) -> str:
            values = [getattr(run, attribute) for run in runs]
            middle = statistics.median(values)
            if len(values) == 1:
                return f"{middle:,.{digits}f}"
            return f"{middle:,.{digits}f} ({_spread(values, digits)})"

        rows.append(
            [
                mode + (f" ({len(failed)} run(s) failed: {failed[0]})" if failed else ""),
                med("per_second", 0),
                med("handoffs", 0),
                med("handoff_median_ms", 2),
                med("handoff_p99_ms", 2),
                f"{statistics.median(run.self_reacquired for run in good):.0%}",
                f"{statistics.median(run.jain for run in good):.3f}",
                med("wait_p99_ms", 1),
                med("wait_max_ms", 0),
                f"{statistics.median(run.lock_requests for run in good):.2f}",
                f"{statistics.median(run.server_cpu_us for run in good):,.0f}",
                str(sum(run.overlaps for run in good)),
                str(sum(run.lost_updates for run in good)),
                str(sum(run.timeouts for run in good)),
            ]
        )
    return _table(header, rows)


def render(results: Results) -> str:
    p = results.params
    lines = [
        "# django-redis-lock scale-out benchmark: one server, Redis Cluster, quorum of 3",
        "",
        f"Written by `benchmarks/bench_scaleout.py` (`make bench`) in {results.seconds:.0f} s. "
        "See its docstring, and `docs/benchmarks.md`, for what is measured.",
        "",
        "## Machine",
        "",
        *(f"- **{key}**: {value}" for key, value in results.machine.items()),
        "",
        "## Uncontended acquire + release",
        "",
        f"One process, one lock object per variant reused for every cycle; {p.cycles:,} timed "
        f"cycles per variant after {p.warmup} warm-up ones, in {p.rounds} rounds (one block "
        "per variant each, order rotated). `Lock(name)` has the default lease (30 s, renewed "
        "in the background). Requests are counted client-side per server (a request to each "
        "of 3 servers counts 3). Server CPU: all the mode's servers together.",
        "",
        *uncontended_table(results),
        "",
        "Ratios of cycle medians: of the pooled samples, and per round (paired, same round).",
        "",
        *ratio_table(results),
        "",
        "## Contended handoff",
        "",
        f"{p.workers} processes, one lock per mode, {p.contended_rounds} run(s) of "
        f"{p.seconds:g} s per mode, modes interleaved; each cycle: `Lock(name, wait="
        f"{p.wait:g})` acquire, INCR `inside` (≠ 1 is an overlap), GET + SET a counter, DECR "
        "`inside`, release (the critical section's 4 round trips go to the single server in "
        "every mode). Handoff: from a release to the next acquisition by another worker. "
        "Median over runs, (min-max) when there are several; overlaps, lost updates and "
        "timeouts summed. In quorum mode a release wakes nobody: waiters look again after "
        "a random 5-30 ms (`quorum/`), so handoffs there take milliseconds and the worker "
        "that just released often takes the lock again.",
        "",
        *contended_table(results),
        "",
    ]
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------


def _log(message: str) -> None:
    print(f"[bench-scaleout {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def profile(urls: dict[str, Any], key: str, cycles: int) -> None:
    """Run ``cycles`` cycles of variant ``key`` under cProfile; print the top costs."""
    variant = VARIANT_BY_KEY[key]
    cycle = variant.build(urls, f"bench:scaleout:profile:{key}")
    _timed(cycle, 300)
    profiler = cProfile.Profile()
    profiler.enable()
    _timed(cycle, cycles)
    profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(35)
    print(f"{cycles} cycles of {key} ({variant.mode}: {variant.title})")
    print(stream.getvalue())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, for a smoke test")
    parser.add_argument("--output", type=Path, default=HERE / "results-scaleout.md")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="profile N cycles, then stop"
    )
    parser.add_argument(
        "--profile-variant",
        default="quorum",
        choices=list(VARIANT_BY_KEY),
        help="the variant --profile runs (default: quorum)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    params = QUICK if args.quick else FULL
    began = time.monotonic()
    with private_servers() as servers:
        urls = servers.urls()
        configure_django(urls)
        if args.profile:
            profile(urls, args.profile_variant, args.profile)
            return 0
        results = Results(params, describe_machine(urls["single"]))
        _log(f"7 servers up; uncontended cycles ({params.rounds} rounds)")
        results.uncontended = measure_uncontended(urls, servers, params)
        ctx = process_context()
        for round_index in range(params.contended_rounds):
            for mode in MODES:
                _log(f"contended round {round_index + 1}/{params.contended_rounds}: {mode}")
                run = run_contended(ctx, urls, servers, mode, params)
                results.contended.setdefault(mode, []).append(run)
    results.seconds = time.monotonic() - began
    report = render(results)
    args.output.write_text(report)
    print(report)
    _log(f"done in {results.seconds:.0f} s; written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
