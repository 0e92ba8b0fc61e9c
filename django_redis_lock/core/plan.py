"""One acquisition's plan: what the flows (``flows.py``, ``replicas.py``) send, and the rules
they follow. Filled in by the primitive that acquires; read, never changed, by the flows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .layout import KeyLayout

__all__ = ["AcquirePlan"]


@dataclass(slots=True)
class AcquirePlan:
    """One acquisition: what to send, and the rules to follow."""

    keys: KeyLayout  # a lock's (lease.LockKeys) or a semaphore's (permits.PermitKeys)
    token: str
    lease_ms: int
    record: str  # the owner record (lease.OwnerRecord.encode())
    max_wait: float  # seconds; math.inf: for ever
    clock: Callable[[], float]  # monotonic seconds
    first: str = "set"  # the first try: a bare SET NX, "take" (take.lua) or "join" (queue)
    queues: bool = True  # the backend has a queue to wait in (not quorum mode)
    fencing: bool = False
    want_result: bool = False  # answer with the guarded work's result when it is there
    # fair=False: the queue keeps when we first queued (a release serves us ahead of barging
    # once we waited STARVATION_BOUND_MS), and a free lock may be taken ahead of us.
    unfair: bool = False
    # The token is a job's (owners.job_token): a result answers only when it names the job.
    job: bool = False
    # Lease values (prefixes) taken over as if the lock were free: the job's reservation.
    takeover: tuple[str, ...] = ()
    only_takeover: bool = False  # a free lock is left free (a reservation renamed)
    limit: int = 0  # a semaphore's number of permits
    report_holder: Callable[[], bool] = lambda: False  # ask for the holder's record now?
    # The first time we must wait: called with the plan and the holder's lease value (or None).
    on_contended: Callable[[AcquirePlan, Any], None] = lambda plan, holder: None
    # Each time a join finds the lock held: called with the plan and the holder's lease value
    # (the watch for dead holders). None: the joins do not ask.
    on_holder: Callable[[AcquirePlan, Any], None] | None = None
    retry_soon: Callable[[BaseException], bool] = lambda error: False  # e.g. TRYAGAIN
    unreachable: Callable[[BaseException], bool] = lambda error: False  # no use telling it
    replicas: int = 0
    replica_timeout_ms: int = 0
    started: float = field(default=0.0)
    # Tokens of this process's earlier waits for this lock that could not step out of the line
    # (Redis unreachable, the connection cut), each with when the queue stops counting it
    # alive (monotonic): stepped out first, so that nobody waits behind a waiter that is gone.
    strays: tuple[tuple[str, float], ...] = ()
    # Called with the plan, a token and that time when a wait could not step out of the line.
    strayed: Callable[[AcquirePlan, str, float], None] = lambda plan, token, until: None
