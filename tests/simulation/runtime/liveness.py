"""Liveness: what must happen, not only what must not.

- **No idle capacity**: a lock that is free (a semaphore with a permit free) while the first
  waiter its queue counts alive is a live client, asking, that could take it, is a violation
  once that lasts :data:`BOUND_US`. The bound: a live waiter blocks at most ``BLOCK_CAP`` at a
  time and asks again when its block ends (``core/flows.py``); a release hands the lock to the
  first live waiter at once. A dead waiter first in line is not one that could take it: the
  queue counts it alive for one liveness window (``BLOCK_CAP + LIVENESS_SLACK`` after it last
  asked), and only then is the live one behind it first. So with no fault, the bound is one
  block; after a fault, the same bound counts from when the fault's waiter left the line.
- **A waiter that goes steps out of the line**: a lock free (or a permit) whose first live
  place in line is a process's that is not asking for it any more (its waiter was cancelled,
  interrupted or gave up) is a violation once that lasts :data:`LEAVE_BOUND_US`: the leave is
  sent as the waiter goes, and arrives before time moves on, unless a fault of that process
  explains it (a crash, a pause, a cut connection, a reply held back). Otherwise its place
  would keep the live waiters behind it out for a liveness window, as a dead process's does.
- **A dead holder is replaced**: a lock held by a crashed process while the first waiter in
  line is a live client asking for it is a violation once that lasts :data:`DEAD_BOUND_US`,
  on one server with no fault but crashes (the watch for dead holders, ``host.py``, of the
  waiter's process ends the lease). The bound: the waiter's join saw the holder (then the
  watch has its pidfd, readable at the crash) or it asks again within one block and sees it
  then; the watch's round trips after that are steps, not time.
- **Nothing held by nobody**: when every client has ended, no lease, permit or place in line of
  ours is left, unless a fault that cut a connection (a crash, a cut, a restart) explains it.
  A lease whose release failed runs out by itself (documented). After a slow reply, at most
  what the library's bounds allow (a hand-off, a liveness window: it counts Redis unreachable
  and does not step out of the line); after a pause or an interrupted call, nothing.
"""

from __future__ import annotations

from typing import Any

from django_redis_lock.core.dead_holders import process_of
from django_redis_lock.core.flows import BLOCK_CAP, HANDOFF_MS, LIVENESS_SLACK

from ..ledger import ROUNDING_US

__all__ = ["BOUND_US", "DEAD_BOUND_US", "LEAVE_BOUND_US", "Liveness"]

BOUND_US = round(BLOCK_CAP * 1e6) + ROUNDING_US
WINDOW_MS = round((BLOCK_CAP + LIVENESS_SLACK) * 1000)  # one liveness window
# A leave arrives before time moves on (time moves only when nothing else can happen): the
# bound is the simulated microseconds its steps take, with room to spare.
LEAVE_BOUND_US = 100_000
DEAD_BOUND_US = BOUND_US + LEAVE_BOUND_US


class Liveness:
    def __init__(self, simulation: Any) -> None:
        self.simulation = simulation
        self.idle_since: dict[str, int] = {}
        self.abandoned_since: dict[tuple[str, str], int] = {}
        self.dead_held_since: dict[str, int] = {}

    def _process_of(self, token: str) -> Any:
        """The simulated process that made ``token`` (a job's hold's too), or None (a job's
        reservation: no process holds it)."""
        owner = process_of(token)
        return next((p for p in self.simulation.processes if p.process_id == owner), None)

    def _slow(self, token: str) -> bool:
        """Whether the process of ``token`` had a reply held back past its timeouts."""
        process = self._process_of(token)
        return process is not None and process.slow_replies > 0

    def _running(self, token: str) -> Any:
        """The process of ``token`` if it runs now (not crashed, nor paused), else None."""
        process = self._process_of(token)
        if process is None or process.crashed or process.paused(self.simulation.now_us):
            return None
        return process

    def _could_take(self, token: str) -> bool:
        """Whether ``token`` is a live client's that is asking now."""
        process = self._running(token)
        return process is not None and bool(process.acquiring)

    def _abandoned(self, token: str) -> bool:
        """Whether ``token`` is a place in line that its live process no longer asks for,
        with no fault of that process to keep it from stepping out."""
        process = self._running(token)
        return (
            process is not None and not process.acquiring
            and not process.slow_replies and not process.cuts
        )  # fmt: skip

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
            self._check_abandoned(name, facts, state, free, first)
            if isinstance(value, str) or value is None:  # (a lock's, not a semaphore's)
                self._check_dead_holder(name, value, first)

    def _check_dead_holder(self, name: str, value: Any, first: str | None) -> None:
        """A lock held by a crashed process, a live waiter first in line (:data:`DEAD_BOUND_US`,
        with no fault but crashes, where the watch runs: not on a quorum)."""
        simulation = self.simulation
        holder = None if value is None else self._process_of(value.split("|", 1)[0])
        if (
            holder is None or not holder.crashed or first is None or not self._could_take(first)
            or simulation.ledger.faults != simulation.crashes or simulation.world.name == "quorum"
        ):  # fmt: skip
            self.dead_held_since.pop(name, None)
            return
        since = self.dead_held_since.setdefault(name, simulation.now_us)
        if simulation.now_us - since > DEAD_BOUND_US:
            simulation.ledger.fail(
                f"{name!r} was held by {holder}, which crashed, for "
                f"{(simulation.now_us - since) / 1000:.3f} ms while {first}, a live waiter "
                "first in line, asked for it: the watch for dead holders did not end its lease"
            )

    def _check_abandoned(
        self, name: str, facts: Any, state: Any, free: bool, first: str | None
    ) -> None:
        """A place in line, or a lease, left to a waiter that went (:data:`LEAVE_BOUND_US`):
        first in line of a free lock, or holding it though no client of the ledger was
        granted it (a hand-off, or a grant, to a waiter that was cancelled meanwhile)."""
        now = self.simulation.now_us
        known = {hold.token for hold in facts.holds}
        value = state.value(facts.lease_key)
        if isinstance(value, dict):  # a semaphore's holders: token -> lease end
            holders = [token for token, ends in value.items() if int(ends) > now // 1000]
        else:
            holders = [] if value is None else [value.split("|", 1)[0]]
        runs_out = self.simulation.runs_out
        left = [
            token for token in holders
            if token not in known and self._abandoned(token) and not runs_out(token)
        ]  # fmt: skip
        if free and first is not None and self._abandoned(first):
            left.append(first)
        for token in left:
            since = self.abandoned_since.setdefault((name, token), now)
            if now - since > LEAVE_BOUND_US:
                where = "holds" if token in holders else "is first in line of"
                self.simulation.ledger.fail(
                    f"{token} {where} {name!r} {(now - since) / 1000:.3f} ms after its process "
                    "stopped asking for it: a waiter went without stepping out, or without "
                    "giving back what it was granted"
                )
        for key in [key for key in self.abandoned_since if key[0] == name and key[1] not in left]:
            del self.abandoned_since[key]

    def at_end(self) -> None:
        ledger = self.simulation.ledger
        if self.simulation.disconnections or ledger.losses:
            return
        state = ledger.state
        now_ms = self.simulation.now_us // 1000
        # After a slow reply the library counts Redis unreachable and does not step out of
        # the line: a lease handed to it meanwhile lasts one hand-off (HANDOFF_MS), and its
        # place in line one liveness window. Anything longer is held by nobody.
        for name, facts in ledger.locks.items():
            key = state.keys.get(facts.lease_key)
            if key is not None:
                if isinstance(key.value, dict):  # a semaphore's holders: token -> lease end
                    token, ends = max(key.value.items(), key=lambda item: item[1])
                    left_ms = int(ends) - now_ms
                else:
                    token, left_ms = key.value.split("|", 1)[0], key.pttl
                slow = self._slow(token)
                if self.simulation.runs_out(token):
                    continue  # its release failed (or its task's run): it runs out, as documented
                if process_of(token) is None:
                    continue  # a job's reservation: a call that never ran keeps it, queued
                if left_ms > 0 and not (slow and left_ms <= HANDOFF_MS):
                    ledger.fail(f"every client ended, and a lease of {name!r} is left for "
                                f"{left_ms} ms: {key.value!r}")  # fmt: skip
            first = _first_live(state, facts, now_ms)
            if first is not None:
                entry = (state.value(facts.waiters_key) or {})[first]
                left_ms = int(entry.split("|", 1)[0]) - now_ms
                if not (self._slow(first) and left_ms <= WINDOW_MS):
                    ledger.fail(f"every client ended, and {first}, a place in {name!r}'s line,"
                                f" is counted alive for {left_ms} ms more")  # fmt: skip


def _first_live(state: Any, facts: Any, now_ms: int) -> str | None:
    waiters = state.value(facts.waiters_key) or {}
    for token in state.value(facts.queue_key) or []:
        entry = waiters.get(token)
        if entry is not None and int(entry.split("|", 1)[0]) >= now_ms:
            return str(token)
    return None
