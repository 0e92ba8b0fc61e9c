"""Liveness: what must happen, not only what must not.

- **No idle capacity**: a lock that is free (a semaphore with a permit free) while the first
  waiter its queue counts alive is a live client, asking, that could take it, is a violation
  once that lasts :data:`BOUND_US`. The bound: a live waiter blocks at most ``BLOCK_CAP`` at a
  time and asks again when its block ends (``core/flows.py``); a release hands the lock to the
  first live waiter at once. A dead waiter first in line is not one that could take it: the
  queue counts it alive for one liveness window (``BLOCK_CAP + LIVENESS_SLACK`` after it last
  asked), and only then is the live one behind it first. So with no fault, the bound is one
  block; after a fault, the same bound counts from when the fault's waiter left the line.
- **Nothing held by nobody**: when every client has ended, no lease, permit or place in line of
  ours is left, unless a fault that cut a connection (a crash, a cut, a restart) explains it:
  a slow reply, a pause, an interrupted call must leave nothing behind.
"""

from __future__ import annotations

from typing import Any

from django_redis_lock.core.dead_holders import PROCESS_ID_LENGTH
from django_redis_lock.core.flows import BLOCK_CAP

from ..ledger import ROUNDING_US

__all__ = ["BOUND_US", "Liveness"]

BOUND_US = round(BLOCK_CAP * 1e6) + ROUNDING_US


class Liveness:
    def __init__(self, simulation: Any) -> None:
        self.simulation = simulation
        self.idle_since: dict[str, int] = {}

    def crashed(self, process: Any) -> None:
        """(Its waiters are no longer live: they could take nothing.)"""

    def _could_take(self, token: str) -> bool:
        """Whether ``token`` is a live client's that is asking now."""
        now = self.simulation.now_us
        for process in self.simulation.processes:
            if (
                token.startswith(process.process_id)
                and len(process.process_id) == PROCESS_ID_LENGTH
            ):
                return not process.crashed and not process.paused(now) and process.acquiring
        return False

    def observed(self, state: Any) -> None:
        ledger = self.simulation.ledger
        now = self.simulation.now_us
        for name, facts in ledger.locks.items():
            if facts.unfair:
                continue  # (fair=False: ledger.py's own check, with its lost-race retry)
            value = state.value(facts.lease_key)
            if facts.limit == 1:
                free = value is None
            else:
                held = value or {}
                free = sum(1 for ends in held.values() if ends > now // 1000) < facts.limit
            first = _first_live(state, facts, now // 1000)
            if free and first is not None and self._could_take(first):
                since = self.idle_since.setdefault(name, now)
                if now - since > BOUND_US:
                    ledger.fail(
                        f"{name!r} was left free for {(now - since) / 1000:.3f} ms while "
                        f"{first}, a live waiter first in line, asked for it"
                    )
            else:
                self.idle_since.pop(name, None)

    def at_end(self) -> None:
        ledger = self.simulation.ledger
        if self.simulation.disconnections or ledger.losses:
            return
        state = ledger.state
        now_ms = self.simulation.now_us // 1000
        for name, facts in ledger.locks.items():
            left = {"lease": state.value(facts.lease_key)}
            # (A waiter's entry counted dead holds nothing up: LEFT, say, scripts.py.)
            left["waiter"] = _first_live(state, facts, now_ms)
            for what, value in left.items():
                if value:
                    ledger.fail(f"every client ended, and a {what} of {name!r} is left: "
                                f"{value!r}")  # fmt: skip


def _first_live(state: Any, facts: Any, now_ms: int) -> str | None:
    waiters = state.value(facts.waiters_key) or {}
    for token in state.value(facts.queue_key) or []:
        entry = waiters.get(token)
        if entry is not None and int(entry.split("|", 1)[0]) >= now_ms:
            return str(token)
    return None
