"""``results.md`` as a whole: the heading, then each section's prose and tables, in order."""

from __future__ import annotations

import os

from benchmarks.harness.crash import crash_params
from benchmarks.harness.markdown import heading
from benchmarks.harness.tables import (
    Results,
    command_mix_table,
    contended_cost_table,
    contended_latency_table,
    crash_table,
    crowd_table,
    memory_table,
    uncontended_table,
    valkey_table,
)
from benchmarks.harness.targets import targets_table
from benchmarks.harness.variants import VARIANTS


def _crash_waits(results: Results) -> str:
    """The crash waits of the rows that have their own, for the crash section's text."""
    waits = [
        f"{variant.title} {crash_params(variant, results.params).crash_wait:g} s"
        for variant in VARIANTS
        if variant.crash_wait is not None and variant.key in results.crash
    ]
    return "; ".join(waits) or "none in this run"


def render(results: Results) -> str:
    p = results.params
    lines = heading("", "bench.py", results.seconds, results.machine)
    lines += [
        "",
        "## Uncontended acquire + release",
        "",
        f"One process, one lock object per library reused for every cycle, "
        f"{p.cycles:,} timed cycles after {p.warmup:,} warm-up ones, taken in {p.rounds} "
        f"round-robin blocks. Median PING round trip (RTT) in the same run: "
        f"**{results.ping.rtt_us:.1f} µs** (client CPU {results.ping.client_cpu_us:.1f} µs, "
        f"server CPU {results.ping.server_cpu_us:.1f} µs per PING); the - 2 RTT columns "
        "subtract two RTTs. A lock on PostgreSQL: its requests are its queries to PostgreSQL "
        "(one to take, one to release), its server CPU (PostgreSQL's) is not measured.",
        "",
    ]
    lines += uncontended_table(results)
    lines += [
        "",
        "## Contended",
        "",
        f"{p.workers} processes, {p.seconds:g} s, one lock; each cycle: acquire, INCR "
        f"`inside` (≠ 1 is an overlap), GET counter, sleep {p.critical_section * 1000:g} ms, "
        f"SET counter + 1, DECR `inside`, release. Lease {p.lease:g} s (ours default: "
        f"30 s renewed), longest wait {p.wait:g} s. Requests counted client-side "
        "(wrapped `send_packed_command`; a pipeline is one), the critical section's own "
        "4 per cycle excluded. Redis commands counted server-side (`INFO commandstats` "
        "before and after the run: a script's own commands count, and so does the "
        "`EVALSHA` itself), the critical section's 4 per acquisition and the harness' 3 "
        "`INFO`s excluded. Server CPU includes the critical section's commands. The "
        "PostgreSQL advisory lock's critical section is on Redis too; its lock requests are "
        "its queries to PostgreSQL (a blocked `pg_advisory_lock` waits in the server), and "
        "Redis' commands and CPU are n/a for it (PostgreSQL's are not measured).",
        "",
    ]
    lines += contended_latency_table(results)
    lines += [""]
    lines += contended_cost_table(results)
    lines += ["", "Redis commands per acquisition, by command (same run):", ""]
    lines += command_mix_table(results)
    lines += [
        "",
        f"## {p.crowd_workers} contending processes",
        "",
        f"The same contended run with {p.crowd_workers} processes (more than the "
        f"{os.cpu_count()} cores can run at once), {p.crowd_seconds:g} s.",
        "",
    ]
    lines += crowd_table(results)
    lines += [
        "",
        "## Memory per held lock",
        "",
        f"One process holds {p.held:,} distinct locks at once (`mem:0` ... "
        f"`mem:{p.held - 1}`, lease {p.held_lease:g} s, not renewed), every library's on one "
        "shared client. Redis `used_memory` (the median of three reads, after "
        f"{p.memory_idle:g} s of quiet) with them held, less before, divided by "
        f"{p.held:,}; of which client buffers: the same for `mem_clients_normal`, the "
        "connections' buffers, which Redis resizes on its own (0 when only the keys "
        f"changed; otherwise the row is measured again, up to {p.memory_attempts} attempts, "
        "and the last is shown, with the bytes without that change next to it); keys: "
        "`DBSIZE` the same way. Each row's locks are released and what they left is "
        "deleted before the next row.",
        "",
    ]
    lines += memory_table(results)
    lines += [
        "",
        "## Crash recovery",
        "",
        f"A holder process takes the lock with a {p.crash_lease:g} s lease (so "
        f"`timeout={p.crash_lease:g}` for ours' fixed-lease row; ours default: "
        f"`DJANGO_REDIS_LOCK_TIMEOUT = {p.crash_lease:g}`, renewed; redis-fifo-lock: "
        f"`lease_ms={p.crash_lease * 1000:.0f}`, renewed), in every row but ours' default "
        "renewed lease row, which leaves `DJANGO_REDIS_LOCK_TIMEOUT` unset (the library's "
        "default lease, renewed: what an application gets). A second process starts "
        "waiting, 0.1 s later the holder is SIGKILLed. `lease end` is the kill time "
        "plus the lease's PTTL read just before the kill, so `lease end → acquired` is the "
        f"library's own detection delay. {p.crash_trials} trial(s) per library. The waiter "
        f"gives up after {p.crash_wait:g} s, except where a library needs longer: "
        f"{_crash_waits(results)}. PostgreSQL's advisory lock has no lease: it ends with the "
        "session, which PostgreSQL closes when the dead holder's socket does.",
        "",
    ]
    lines += crash_table(results)
    lines += [
        "",
        "## Redis and Valkey",
        "",
        f"The contended run ({p.workers} processes, {p.seconds:g} s) again on a private "
        f"valkey-server, in the same run: {results.valkey_server or 'not run'}. The Redis "
        "columns are the contended table's.",
        "",
    ]
    lines += valkey_table(results)
    lines += ["", "## Targets for django-redis-lock", ""]
    lines += targets_table(results)
    lines.append("")
    return "\n".join(lines)
