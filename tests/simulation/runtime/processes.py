"""Simulated processes: several of them in the simulation's one Python process.

What the library keeps per process (the watchdog, the places its acquisitions left in lines, the
tokens it holds, its re-entrant holds) is swapped in whenever one of its threads runs
(:meth:`SimulatedProcess.enter`), as an operating system switches address spaces: a process
crashes (all its threads at once, its watchdog with them) and the others go on.

:data:`PER_PROCESS` names what is swapped; ``tests/locks/test_runtime_simulation.py``
fails when the library grows a per-process object that it does not name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django_redis_lock.primitives import contention, own_tokens, owners, reentrancy, strays
from django_redis_lock.primitives.background import dead_holders, process_records, renewal

__all__ = ["PER_PROCESS", "SimulatedProcess"]

# The library's per-process objects: (module, name of the object in it). Each is given a fresh
# state of its own per simulated process (its __dict__).
PER_PROCESS: tuple[tuple[Any, str], ...] = (
    (strays, "strays"),
    (contention, "contention"),
    (own_tokens, "own_tokens"),
    (reentrancy, "reentrant_holds"),
    (process_records, "recorded"),
    (dead_holders, "dead_holder_watch"),  # (its thread an actor of the process: host.py)
)


def _fresh(kept: Any) -> dict[str, Any]:
    """A fresh state of the per-process object ``kept``: what a forked child starts with
    (``clear()``, the library's at-fork reset, where it has one; else a new instance)."""
    if hasattr(kept, "clear") and not isinstance(kept, dict):
        fresh = object.__new__(type(kept))
        fresh.clear()
        return vars(fresh)
    return vars(type(kept)())


@dataclass(eq=False)
class SimulatedProcess:
    name: str
    clock: Any
    pid: int = 0  # on the simulated host (host.py)
    started_us: int = 0  # when it started: what the host tells of it while it runs
    crashed: bool = False
    paused_until_us: int = 0
    states: list[dict[str, Any]] = field(default_factory=list)
    renewer: Any = None
    process_id: str = ""
    acquiring: int = 0  # how many of its clients wait for a lock now (liveness.py)
    crash_at_us: int | None = None  # a crash the cast planned (programs.py), with faults on
    slow_replies: int = 0  # replies to it held back past its timeouts (liveness.py)
    cuts: int = 0  # its connections cut by a fault (a cut, a restart): it may not step out

    def __post_init__(self) -> None:
        owners.new_identity()  # (its random bytes: the simulation's seeded ones)
        self.process_id = owners.process_id
        self.states = [_fresh(getattr(module, name)) for module, name in PER_PROCESS]
        self.renewer = renewal.Renewer(self.clock, at_fork=False)

    def enter(self) -> None:
        """Make this process's state the library's (before one of its threads runs)."""
        for (module, name), state in zip(PER_PROCESS, self.states, strict=True):
            getattr(module, name).__dict__ = state
        renewal.renewer = self.renewer
        owners.process_id = self.process_id
        owners.pid = self.pid

    def paused(self, now_us: int) -> bool:
        return self.paused_until_us > now_us

    def __repr__(self) -> str:
        return self.name
