"""What the simulated clients believe, beside what Redis holds, and the invariants checked
between the two after every step. A broken invariant is a :class:`Violation` (with the step's
number); the simulation stops there and prints its trace.

The invariants:

- **exclusion**: at most ``limit`` clients (1 for a lock, N for a semaphore) believe they hold
  it at once. A holder believes until its lease ends by its own reckoning (sent at + lease,
  lengthened by each renewal that succeeded), until it is told the lease is lost, or until it
  released. After Redis lost data (a restart), every hold is *exposed*: its lease may be gone
  and another may take the lock; it is not counted until a renewal or release proves its lease
  was still there, and it must be told it lost it otherwise;
- **fencing**: each fenced grant's token is larger than every one granted before for the lock;
- **no double run**: a client that asked for the guarded work's result (``want_result``) is
  never granted the lock while that result is kept;
- **all or nothing**: a ``lock_many`` that gave up holds none of the locks it had taken;
- **FIFO**: while no fault intervened, a grant never passes over a live waiter queued ahead;
- **no idle unfair lock**: while no fault intervened, time passes with a ``fair=False`` lock
  free and a live waiter in line only until that waiter asks again on its own (the '~' of its
  entry, after it lost the race for the lock: ``LOST_RACE_RETRY_MS``);
- **expiries**: every key of ours has one, after every step;
- **bounded waits**: no block lasts past its acquisition's deadline nor past ``BLOCK_CAP``, and an
  acquisition that nothing paused returns by its deadline;
- **told, not fooled**: a renewal or release that finds the lease gone while it should still
  run, with no fault to explain it, is a violation (and a hold is never kept after it is told).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django_redis_lock.core.flows import BLOCK_CAP
from django_redis_lock.core.lease import LockKeys, reservation_token
from django_redis_lock.core.uncontended import STARVATION_BOUND_MS

__all__ = ["Hold", "Ledger", "Violation"]

# Slack for the rounding of block lengths to whole milliseconds.
ROUNDING_US = 2000


class Violation(AssertionError):
    """An invariant broken at step ``step``."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(f"step {step}: {message}")
        self.step = step
        self.message = message


@dataclass(slots=True)
class Hold:
    client: str
    lock: str
    token: str
    fence: int
    valid_until_us: int
    exposed: bool = False
    ended: bool = False
    losses: int = 0  # Redis's data losses before it was granted (Ledger.losses)

    def believed(self, now_us: int) -> bool:
        return not self.ended and not self.exposed and self.valid_until_us > now_us


@dataclass(slots=True)
class LockFacts:
    """What the ledger knows of one lock: its limit, keys, and grants so far."""

    limit: int
    lease_key: str
    queue_key: str
    waiters_key: str
    result_key: str | None
    max_fence: int = 0
    lapsed: bool = False  # a lease ran out under its holder: FIFO no longer applies
    # Taken with fair=False by some client: FIFO does not apply, the starvation bound does.
    unfair: bool = False
    holds: list[Hold] = field(default_factory=list)


class Ledger:
    def __init__(self) -> None:
        self.locks: dict[str, LockFacts] = {}
        self.step = 0
        self.now_us = 0
        self.faults = 0  # faults injected so far
        self.losses = 0  # times Redis lost data (restarts), so far
        self.state: Any = None  # the latest Observed
        self.before: Any = None  # the one before it (the state a step started from)
        self.observed_us = 0  # when the latest was observed (now_us then)

    def lock(self, name: str, facts: LockFacts) -> None:
        self.locks[name] = facts

    def fail(self, message: str) -> None:
        raise Violation(self.step, message)

    # -- after every step ----------------------------------------------------------------------

    def observed(self, state: Any) -> None:
        self.before, self.state = self.state, state
        since_us, self.observed_us = self.observed_us, self.now_us
        for key, key_state in state.keys.items():
            if key_state.pttl == -1:
                self.fail(f"key {key!r} has no expiry")
        for facts in self.locks.values():
            # A lease ran out under its holder (or a phantom's: a grant whose reply was lost):
            # the lock was free with waiters queued, and the first to ask takes it.
            if facts.lease_key in state.expired or any(
                not h.ended and h.valid_until_us <= self.now_us for h in facts.holds
            ):
                facts.lapsed = True
            if self.before is not None and not self.faults and not facts.lapsed:
                if facts.unfair:
                    self._check_starvation(facts)
                    if self.now_us - since_us > ROUNDING_US:
                        self._check_not_left_idle(facts, since_us)
                else:
                    self._check_order(facts)

    # -- what clients report -------------------------------------------------------------------

    def granted(
        self, client: str, lock: str, token: str, fence: int, valid_until_us: int,
        *, fenced: bool = False, want_result: bool = False, job: str = "",
        losses: int | None = None,
    ) -> Hold:  # fmt: skip
        """``losses``: Redis's data losses when the acquisition began, if not now: a lease
        taken before a later loss may be gone, and the hold is *exposed* from the start."""
        facts = self.locks[lock]
        if losses is not None and losses != self.losses:
            hold = Hold(client, lock, token, fence, valid_until_us, exposed=True, losses=losses)
            facts.holds.append(hold)
            return hold
        if job and not token.endswith("~queued"):  # a run takes its job's reservation over
            for hold in facts.holds:
                if hold.token == f"{job}~queued":
                    hold.ended = True
        believing = [hold for hold in facts.holds if hold.believed(self.now_us)]
        if len(believing) + 1 > facts.limit:
            others = ", ".join(f"{h.client} (until {h.valid_until_us})" for h in believing)
            self.fail(
                f"{client} was granted {lock!r} while {others} held it (limit {facts.limit})"
            )
        if fenced:
            if fence <= facts.max_fence:
                self.fail(f"{client}'s fencing token {fence} for {lock!r} is not above "
                          f"{facts.max_fence}, granted before")  # fmt: skip
            facts.max_fence = fence
        result_key = facts.result_key
        if result_key and job:  # (a job's result is its own: LockKeys.result_of)
            result_key = LockKeys.of(facts.lease_key).result_of(reservation_token(job))
        kept = self.state.value(result_key) if result_key else None
        if want_result and kept is not None and (not job or kept == job):
            self.fail(f"{client} was granted {lock!r} to run the work again: its result is kept")
        hold = Hold(client, lock, token, fence, valid_until_us, losses=self.losses)
        facts.holds.append(hold)
        return hold

    def acted(self, hold: Hold, valid_until_us: int) -> None:
        """``hold``'s client acts on the guarded resource now, believing its lease runs until
        ``valid_until_us`` (``held_until``, its own word): no more than the lock's limit may
        believe so at once."""
        hold.valid_until_us = valid_until_us
        facts = self.locks[hold.lock]
        believing = [h for h in facts.holds if h.believed(self.now_us)]
        if hold in believing and len(believing) > facts.limit:
            others = ", ".join(
                f"{h.client} (until {h.valid_until_us})" for h in believing if h is not hold
            )
            self.fail(f"{hold.client} acts on {hold.lock!r} while {others} hold it "
                      f"(limit {facts.limit})")  # fmt: skip

    def _check_order(self, facts: LockFacts) -> None:
        """The holders that appeared with this step were first in line among the live waiters
        (checked against the state the step started from)."""
        before, after = self.before.value(facts.lease_key), self.state.value(facts.lease_key)
        new = _holders(after) - _holders(before)
        if not new:
            return
        queue = self.before.value(facts.queue_key) or []
        waiters = self.before.value(facts.waiters_key) or {}
        now_ms = self.now_us // 1000
        for token in new:
            ahead = queue[: queue.index(token)] if token in queue else queue
            for other in ahead:
                entry = waiters.get(other)
                if other not in new and entry and int(entry.split("|", 1)[0]) >= now_ms:
                    self.fail(f"{token} was granted {facts.lease_key!r} ahead of {other}, a "
                              "live waiter queued before it")  # fmt: skip

    def _check_starvation(self, facts: LockFacts) -> None:
        """fair=False: a lease that left its holder with this step (a release) went to the
        first live waiter if that one had waited STARVATION_BOUND_MS since it first queued
        (the '@' of its entry): a starved waiter is served next, never passed again."""
        before, after = self.before.value(facts.lease_key), self.state.value(facts.lease_key)
        if before is None or _holders(after) == _holders(before):
            return
        now_ms = self.now_us // 1000
        first = self._first_live_waiter(facts, now_ms)
        if first is None:
            return
        token, entry = first
        since = entry.split("|", 2)[1].partition("@")[2]
        if (not since or now_ms - int(since) >= STARVATION_BOUND_MS) and (
            token not in _holders(after)
        ):
            self.fail(f"{token} had waited past the bound for {facts.lease_key!r}, and "
                      "the release did not hand it the lock")  # fmt: skip

    def _check_not_left_idle(self, facts: LockFacts, since_us: int) -> None:
        """fair=False: time passed (from ``since_us``, by more than a rounding) while the lock
        was free with a live waiter in line: only while the first live one had said it asks
        again on its own by then (it lost the race for the lock, join.lua's '~')."""
        if self.before.value(facts.lease_key) is not None:
            return
        first = self._first_live_waiter(facts, since_us // 1000)
        if first is None:
            return
        token, entry = first
        flags = entry.split("|", 2)[1].partition("@")[0]
        retries_by = int(flags.partition("~")[2] or 0)
        if self.now_us > retries_by * 1000 + ROUNDING_US:
            self.fail(f"{facts.lease_key!r} was left free for "
                      f"{(self.now_us - since_us) / 1000:.3f} ms while {token} waited "
                      "in line")  # fmt: skip

    def _first_live_waiter(self, facts: LockFacts, at_ms: int) -> tuple[str, str] | None:
        """The first waiter in line (token, entry), in the state the step started from, that
        the queue still counted alive at ``at_ms``; the dead ones before it are out of the
        line."""
        waiters = self.before.value(facts.waiters_key) or {}
        for token in self.before.value(facts.queue_key) or []:
            entry = waiters.get(token)
            if entry is not None and int(entry.split("|", 1)[0]) >= at_ms:
                return token, entry
        return None

    def renewed(self, hold: Hold, sent_us: int, lease_ms: int, extended: bool) -> None:
        if extended:
            hold.valid_until_us = max(hold.valid_until_us, sent_us + lease_ms * 1000)
            if hold.exposed:  # its lease was there after all: counted again
                hold.exposed = False
                believing = [h for h in self.locks[hold.lock].holds if h.believed(self.now_us)]
                if len(believing) > self.locks[hold.lock].limit:
                    self.fail(f"{hold.client}'s lease of {hold.lock!r} outlived a restart "
                              f"while another holder took it")  # fmt: skip
            return
        self._told_lost(hold, "renewal")

    def releasing(self, hold: Hold) -> None:
        """The work under ``hold`` is over: its holder no longer acts on the lock."""
        hold.ended = True

    def released(self, hold: Hold, code: int) -> None:
        if code == -2:
            self.fail(f"{hold.client}'s release of {hold.lock!r} found no lock there")
        if code < 0:
            self._told_lost(hold, "release")
        hold.ended = True

    def _told_lost(self, hold: Hold, what: str) -> None:
        if hold.valid_until_us > self.now_us and not hold.exposed and not self.faults:
            left = (hold.valid_until_us - self.now_us) / 1000
            self.fail(f"{hold.client}'s {what} found its lease of {hold.lock!r} gone, "
                      f"{left:.3f} ms before it ends")  # fmt: skip
        hold.ended = True

    def reservation_ended(self, job: str, code: int | None) -> None:
        """``reservations.cancel`` ended ``job``'s reservation (0), found none (-1: one made since
        may be there), or failed (None: it may have ended it)."""
        for facts in self.locks.values():
            for hold in facts.holds:
                if hold.token == f"{job}~queued" and code != -1:
                    hold.ended = True

    def none_held(self, client: str, taken: list[Hold]) -> None:
        """``client``'s ``lock_many`` gave up and gave back what it had ``taken``: none of
        those leases may be left in its name (unless Redis lost data since, and a restart from
        a snapshot brought one back)."""
        for hold in taken:
            if hold.losses != self.losses:
                continue
            lock, token = hold.lock, hold.token
            value = self.state.value(self.locks[lock].lease_key)
            if value is not None and value.split("|", 1)[0] == token:
                self.fail(f"{client} gave up its lock_many but still holds {lock!r}")

    def taken_over(self, lock: str, token: str) -> None:
        """The watch for dead holders ends the lease ``token`` holds of ``lock``: a dead
        client's, whose hold counts for nothing from now on."""
        for hold in self.locks[lock].holds:
            if hold.token == token:
                hold.ended = True

    def ended(self, hold: Hold) -> None:
        """The holder stopped believing (its release failed: the work is over)."""
        hold.ended = True

    def data_lost(self) -> None:
        self.losses += 1
        for facts in self.locks.values():
            for hold in facts.holds:
                if not hold.ended:
                    hold.exposed = True

    def blocked(self, client: str, seconds: float, deadline_us: int | None) -> None:
        if seconds * 1e6 > BLOCK_CAP * 1e6 + ROUNDING_US:
            self.fail(f"{client} blocks {seconds:.3f} s, past BLOCK_CAP")
        if deadline_us is not None and self.now_us + seconds * 1e6 > deadline_us + ROUNDING_US:
            self.fail(f"{client} blocks {seconds:.3f} s, past its wait's deadline "
                      f"({(deadline_us - self.now_us) / 1e6:.3f} s away)")  # fmt: skip

    def returned(self, client: str, deadline_us: int, paused: bool) -> None:
        if not paused and self.now_us > deadline_us + ROUNDING_US:
            self.fail(f"{client}'s acquisition returned {(self.now_us - deadline_us) / 1e3:.3f}"
                      " ms after its deadline")  # fmt: skip


def _holders(value: Any) -> set[str]:
    """The tokens holding a lock (its lease value) or a semaphore (its holders' scores)."""
    if value is None:
        return set()
    if isinstance(value, dict):
        return set(value)
    return {value.split("|", 1)[0]}
