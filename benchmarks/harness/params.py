"""``bench.py``'s run parameters: the full run's and ``--quick``'s."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Params:
    cycles: int = 5000  # timed uncontended cycles per library
    warmup: int = 500  # untimed cycles before them
    rounds: int = 25  # the cycles are taken in this many round-robin blocks (fair to noise)
    workers: int = 6  # contended processes
    seconds: float = 5.0  # contended run length
    critical_section: float = 0.0005  # the sleep inside the lock
    lease: float = 10.0  # lease for uncontended and contended runs (non-renewing variants)
    wait: float = 10.0  # longest wait for one acquisition
    crash_lease: float = 1.0
    crash_trials: int = 3
    crash_wait: float = 5.0
    crowd_workers: int = 24  # the second contended run: more processes than cores
    crowd_seconds: float = 5.0
    held: int = 5000  # locks held at once for the memory section
    held_lease: float = 60.0
    memory_idle: float = 0.3  # seconds without a command before used_memory is read
    memory_attempts: int = 3  # a row is measured again when connection buffers changed


FULL = Params()
QUICK = Params(cycles=1000, warmup=100, rounds=5, seconds=1.5, crash_trials=1, crowd_seconds=1.5)
