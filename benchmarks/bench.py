"""Benchmark django-redis-lock against the other Python Redis locks, on one private redis-server.

    make bench                       # or: .venv/bin/python -m benchmarks.bench [--quick]

The measurements, each a module of ``benchmarks.harness``, run in this order:

1. ``uncontended``: one process, acquire + release of a free lock, minus two PING round trips
   (so what is left is the lock's own cost above the network floor).
2. ``memory``: one process holds 5,000 locks at once; Redis ``used_memory`` with them held,
   less before, per lock.
3. ``contention``: 6 processes fight for one lock, each doing a deliberately non-atomic counter
   update (GET, ~0.5 ms, SET) inside it, plus an overlap detector; then the same with 24
   processes.
4. ``crash``: a holder with a 1 s lease is SIGKILLed while another process waits.

Then the contended run again on a private valkey-server. Beside the Redis locks, two rivals of
another kind (``harness.rivals``): PostgreSQL's advisory locks (on a throw-away PostgreSQL
cluster, ``harness.servers.private_postgres``) and redis-fifo-lock (asyncio only, driven on a
private event loop per process).

Requests (round trips) are counted on the client side, by wrapping redis-py's
``AbstractConnection.send_packed_command`` (and its asyncio twin): one call is one request
sent, whether it carries one command or a whole pipeline. The contended runs also count the
commands the server ran (``INFO commandstats`` before and after: in Redis 7 that includes the
commands a Lua script runs internally, and the ``EVALSHA`` itself), a different figure from the
round trips. See ``benchmarks/README.md`` for what each number means. Results go to
``benchmarks/results.md`` (and stdout).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness.contention import Contended, process_context, run_contended
from benchmarks.harness.crash import run_crash
from benchmarks.harness.machine import describe_machine, log
from benchmarks.harness.memory import held_rows, measure_held_memory
from benchmarks.harness.params import FULL, QUICK, Params
from benchmarks.harness.report import render
from benchmarks.harness.rivals import configure_django
from benchmarks.harness.servers import (
    EmbeddedRedis,
    RedisServerNotFound,
    find_valkey_server,
    private_redis,
)
from benchmarks.harness.tables import Results
from benchmarks.harness.uncontended import measure_uncontended
from benchmarks.harness.variants import (
    VARIANT_BY_KEY,
    Variant,
    chosen_variants,
    postgres_for,
    unavailable_reason,
)

HERE = Path(__file__).resolve().parent


def run_on_valkey(ctx: Any, runnable: Sequence[Variant], params: Params, results: Results) -> None:
    """The contended run of every library again, on a private valkey-server."""
    try:
        binary = find_valkey_server()
    except RedisServerNotFound as exc:
        results.valkey_server = f"n/a ({exc})"
        return
    with EmbeddedRedis(binary=binary) as server:
        info = redis.Redis.from_url(server.url).info("server")
        results.valkey_server = f"Valkey {info.get('valkey_version', info['redis_version'])}"
        for variant in runnable:
            if not variant.on_redis:
                reason = f"not a Redis lock (it is on {variant.server})"
                results.valkey[variant.key] = Contended(not_applicable=reason)
                continue
            log(f"contended on Valkey: {variant.key}")
            results.valkey[variant.key] = run_contended(ctx, variant, server.url, params)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, for a smoke test")
    parser.add_argument(
        "--only", default="", help="comma-separated variant keys: " + ", ".join(VARIANT_BY_KEY)
    )
    parser.add_argument("--output", type=Path, default=HERE / "results.md")
    return parser.parse_args(argv)


def run_sections(results: Results, runnable: Sequence[Variant], url: str) -> None:
    """Every section, for the variants that can run (crash-only ones: in the crash section)."""
    params = results.params
    measured = [variant for variant in runnable if not variant.crash_only]
    log(f"redis-server at {url}; uncontended cycles")
    results.ping, results.uncontended = measure_uncontended(measured, url, params)
    log(f"memory: {params.held:,} held locks per library")
    results.memory = measure_held_memory(held_rows(measured), url, params)
    ctx = process_context()
    for variant in measured:
        log(f"contended: {variant.key}")
        results.contended[variant.key] = run_contended(ctx, variant, url, params)
    crowd = dataclasses.replace(params, workers=params.crowd_workers, seconds=params.crowd_seconds)
    for variant in measured:
        log(f"contended, {crowd.workers} processes: {variant.key}")
        results.crowd[variant.key] = run_contended(ctx, variant, url, crowd)
    for variant in runnable:
        log(f"crash recovery: {variant.key}")
        results.crash[variant.key] = run_crash(ctx, variant, url, params)
    run_on_valkey(ctx, measured, params, results)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    params = QUICK if args.quick else FULL
    variants = chosen_variants(args.only)
    skipped = {v.key: reason for v in variants if (reason := unavailable_reason(v)) is not None}
    began = time.monotonic()
    with private_redis() as url, postgres_for(variants, skipped) as postgres:
        for key, reason in skipped.items():
            log(f"{key}: n/a ({reason})")
        configure_django(url)
        machine = describe_machine(redis.Redis.from_url(url))
        machine["PostgreSQL"] = postgres
        results = Results(params, machine, skipped)
        run_sections(results, [v for v in variants if v.key not in skipped], url)
    results.seconds = time.monotonic() - began
    report = render(results)
    args.output.write_text(report)
    print(report)
    log(f"done in {results.seconds:.0f} s; written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
