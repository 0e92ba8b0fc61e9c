"""``results.md``'s targets for django-redis-lock: each a goal on the run's figures, met or
missed, in both of ours' columns.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.harness.contention import Contended
from benchmarks.harness.markdown import md_table
from benchmarks.harness.tables import Results
from benchmarks.harness.variants import VARIANT_BY_KEY, VARIANTS


@dataclass(frozen=True)
class Target:
    what: str  # "{crowd}" stands for the crowded run's number of processes
    goal: str
    check: Callable[[Results, str], tuple[str, bool] | None]  # -> (measured, met) or None


def _t_cycle(results: Results, key: str) -> tuple[str, bool] | None:
    ours, raw = results.uncontended.get(key), results.uncontended.get("raw")
    if not ours or not raw or ours.error or raw.error:
        return None
    over = ours.median_us - raw.median_us
    if raw.above_median_us <= 0:
        # The floor's cycle is no longer than two PINGs through redis-py: a ratio means nothing.
        detail = (
            f"{ours.above_median_us:.1f} µs vs floor {raw.above_median_us:.1f} µs (the floor "
            f"is within two PINGs: no ratio); ours' cycle is {over:.1f} µs over the floor's"
        )
        return detail, ours.above_median_us <= 0
    ratio = ours.above_median_us / raw.above_median_us
    detail = f"{ours.above_median_us:.1f} µs vs floor {raw.above_median_us:.1f} µs = {ratio:.2f}x"
    return detail, ratio <= 1.3


def _contended_check(
    attribute: str, goal: Callable[[float], bool], fmt: str, run: str = "contended"
) -> Callable[[Results, str], tuple[str, bool] | None]:
    """A goal on one number of ours' row of ``results.<run>`` ("contended" or "crowd")."""

    def check(results: Results, key: str) -> tuple[str, bool] | None:
        result = getattr(results, run).get(key)
        if not result or result.error:
            return None
        value = getattr(result, attribute)
        return fmt.format(value), goal(value)

    return check


def _compared_check(
    attribute: str, other: str, goal: Callable[[float, float], bool], fmt: str, run: str
) -> Callable[[Results, str], tuple[str, bool] | None]:
    """A goal on one number of ours' row against another library's (``other``), same run."""

    def check(results: Results, key: str) -> tuple[str, bool] | None:
        runs: dict[str, Contended] = getattr(results, run)
        ours, theirs = runs.get(key), runs.get(other)
        if not ours or ours.error:
            return None
        mine = getattr(ours, attribute)
        if not theirs or theirs.error:
            return f"{fmt.format(mine)} ({VARIANT_BY_KEY[other].title}: n/a)", False
        value = getattr(theirs, attribute)
        detail = f"{fmt.format(mine)} vs {fmt.format(value)}"
        if attribute == "per_second" and value > 0:
            detail += f" = {mine / value:.3f}x"
        return detail, goal(mine, value)

    return check


def _t_memory(row: str, bound: float) -> Callable[[Results, str], tuple[str, bool] | None]:
    """Bytes per held lock of memory row ``row`` (the same figure in both of ours' columns:
    the memory section measures its own two rows of ours, with a fixed 60 s lease)."""

    def check(results: Results, key: str) -> tuple[str, bool] | None:
        result = results.memory.get(row)
        if not result or result.error:
            return None
        return f"{result.bytes_per_lock:.0f} B", result.bytes_per_lock <= bound

    return check


def _t_crash(row: str, bound_ms: float) -> Callable[[Results, str], tuple[str, bool] | None]:
    """Kill → acquired of crash row ``row``, in every trial (the same figure in both of ours'
    columns: the crash section's own row of ours, with the default renewed lease)."""

    def check(results: Results, key: str) -> tuple[str, bool] | None:
        result = results.crash.get(row)
        if not result:
            return None
        if not result.after_kill_ms:
            return f"error: {result.error}", False
        times = result.after_kill_ms
        detail = f"median {statistics.median(times):,.1f} ms, max {max(times):,.1f} ms"
        if result.error:
            return f"{detail} (then error: {result.error})", False
        return detail, max(times) <= bound_ms

    return check


def _t_safety(results: Results, key: str) -> tuple[str, bool] | None:
    measured = [
        (f"{workers} processes", result)
        for workers, result in (
            (results.params.workers, results.contended.get(key)),
            (results.params.crowd_workers, results.crowd.get(key)),
        )
        if result is not None and not result.error
    ]
    if not measured:
        return None
    detail = "; ".join(
        f"{where}: {r.overlaps} overlaps, {r.lost_updates} lost" for where, r in measured
    )
    return detail, all(r.overlaps == 0 and r.lost_updates == 0 for _, r in measured)


def _of(key: str, check: Callable[[Results, str], tuple[str, bool] | None]) -> Any:
    """``check`` on variant ``key``'s row whichever of ours' columns asks (the same figure in
    both, as the memory targets)."""
    return lambda results, _column: check(results, key)


# The rivals of another kind (issue 32): variant key, and the name the targets give it.
RIVALS = (("pg_advisory", "PostgreSQL advisory lock"), ("redis_fifo_lock", "redis-fifo-lock"))


def _ahead_of_rivals(run: str, where: str) -> list[Target]:
    """Ours' acquisitions/s ≥ each rival's in ``run`` ("contended" or "crowd")."""
    return [
        Target(
            f"{where}: acquisitions/s",
            f"≥ {name}'s",
            _compared_check("per_second", other, lambda o, r: o >= r, "{:,.0f}", run),
        )
        for other, name in RIVALS
    ]


TARGETS = (
    Target(
        "contended acquisitions/s",
        "≥ 0.95 x raw floor's",
        _compared_check("per_second", "raw", lambda o, r: o >= 0.95 * r, "{:,.0f}", "contended"),
    ),
    Target(
        "contended Jain fairness",
        "≥ 0.99",
        _contended_check("jain", lambda v: v >= 0.99, "{:.3f}"),
    ),
    Target(
        "contended handoff p99",
        "≤ 0.6 ms",
        _contended_check("handoff_p99_ms", lambda v: v <= 0.6, "{:.3f} ms"),
    ),
    Target(
        "contended wait p99",
        "≤ 8 ms",
        _contended_check("wait_p99_ms", lambda v: v <= 8.0, "{:.2f} ms"),
    ),
    Target(
        "lock round trips per contended acquisition",
        "≤ 3",
        _contended_check("lock_requests", lambda v: v <= 3.0, "{:.2f}"),
    ),
    Target(
        "Redis commands per contended acquisition (incl. Lua)",
        "≤ 20",
        _contended_check("redis_commands", lambda v: v <= 20.0, "{:.2f}"),
    ),
    Target(
        "server CPU per contended acquisition",
        "≤ raw floor's",
        _compared_check("server_cpu_us", "raw", lambda o, r: o <= r, "{:.1f} µs", "contended"),
    ),
    Target("uncontended cycle - 2 RTT", "≤ 1.3 x raw floor's", _t_cycle),
    Target(
        "bytes per held lock, defaults (`Lock(name, timeout=60)`)",
        "≤ 220",
        _t_memory("ours_t60", 220),
    ),
    Target(
        "bytes per held lock, with fencing + reentrant + label",
        "≤ 400",
        _t_memory("ours_all", 400),
    ),
    Target(
        "{crowd} contending processes: acquisitions/s",
        "≥ python-redis-lock's",
        _compared_check(
            "per_second", "python_redis_lock", lambda o, r: o >= r, "{:,.0f}", "crowd"
        ),
    ),
    Target(
        "{crowd} contending processes: Jain fairness",
        "≥ 0.99",
        _contended_check("jain", lambda v: v >= 0.99, "{:.3f}", run="crowd"),
    ),
    Target("overlaps and lost updates (both contended runs)", "0 and 0", _t_safety),
    # Issue 32: at least the rivals of another kind's throughput (its Jain goals: see above).
    *_ahead_of_rivals("contended", "contended"),
    *_ahead_of_rivals("crowd", "{crowd} contending processes"),
    # fair=False (issue 32): barging for throughput, its starvation bounded.
    Target(
        "{crowd} processes, `fair=False`: acquisitions/s",
        "≥ python-redis-lock's",
        _of(
            "ours_unfair",
            _compared_check(
                "per_second", "python_redis_lock", lambda o, r: o >= r, "{:,.0f}", "crowd"
            ),
        ),
    ),
    Target(
        "{crowd} processes, `fair=False`: acquisitions/s",
        "≥ raw floor's",
        _of(
            "ours_unfair",
            _compared_check("per_second", "raw", lambda o, r: o >= r, "{:,.0f}", "crowd"),
        ),
    ),
    Target(
        "{crowd} processes, `fair=False`: wait p99",
        "≤ python-redis-lock's",
        _of(
            "ours_unfair",
            _compared_check(
                "wait_p99_ms", "python_redis_lock", lambda o, r: o <= r, "{:.1f} ms", "crowd"
            ),
        ),
    ),
    Target(
        "crash recovery: holder SIGKILLed, same host, default renewed lease (kill → acquired)",
        "≤ 50 ms",
        _t_crash("ours_renewed", 50.0),
    ),
)


def targets_table(results: Results) -> list[str]:
    ours = [variant for variant in VARIANTS if variant.key in ("ours", "ours_t10")]
    header = ["target", "goal", *(v.title for v in ours)]
    rows = []
    for target in TARGETS:
        cells = [target.what.format(crowd=results.params.crowd_workers), target.goal]
        for variant in ours:
            outcome = (
                None if variant.key in results.skipped else target.check(results, variant.key)
            )
            if outcome is None:
                cells.append("not measured")
            else:
                detail, met = outcome
                cells.append(f"{'✅ met' if met else '❌ missed'}: {detail}")
        rows.append(cells)
    return md_table(header, rows)
