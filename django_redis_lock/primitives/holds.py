"""Who holds what in this process: an acquisition belongs to one owner and one process.

The owner is the asyncio task running the code, else the thread. A hold never crosses a
``fork()``: the child inherits the parent's memory, holds included, but not the right to
release or renew them (the parent is still inside its critical section), so a hold carries the
pid that took it and is ignored elsewhere. Nor does it outlive its owner: the watchdog asks
:class:`HoldWatch` whether anyone can still release a lease before renewing it.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import socket
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.durations import clock_allowance
from ..core.lease import JOB_SEPARATOR, OwnerRecord, holder_token

if TYPE_CHECKING:
    from ..core.renewal import RenewedLease

__all__ = [
    "HOST",
    "Hold",
    "HoldWatch",
    "OwnerRecords",
    "current_owner",
    "job_token",
    "new_token",
    "own_tokens",
    "owner_description",
    "owner_record",
    "pid",
    "process_alive",
    "process_id",
    "reentrant_holds",
    "strays",
]

#: This machine's name, as owner records give it.
HOST = socket.gethostname()

#: This process' pid, kept up to date across fork() rather than asked of the kernel on every
#: acquire and release: a hold whose ``pid`` differs is a forked child's copy of its parent's.
pid = os.getpid()

# Random bytes for tokens, taken from the OS a few kilobytes at a time rather than with a
# system call per acquisition; emptied at fork, so that a child never reuses its parent's.
_random = bytearray()
_random_lock = threading.Lock()


def _process_id() -> str:
    """This process's id, which its tokens start with (``core/dead_holders.py``): 48 random bits,
    8 URL-safe characters, never a leading ``-`` (a command line would take a token for an
    option: ``redis_locks release-permit NAME -x...``)."""
    made = base64.urlsafe_b64encode(secrets.token_bytes(6)).decode()
    return made if made[0] != "-" else "_" + made[1:]


#: This process's id (new in a forked child), the first PROCESS_ID_LENGTH characters of its
#: tokens: a waiter finds this process's record by it (``background/process_records.py``).
process_id = _process_id()


def new_token() -> str:
    """A new owner token: this process's id, then 48 random bits of its own (``secrets``'
    source), 16 URL-safe characters in all."""
    global _random
    with _random_lock:
        if len(_random) < 6:
            _random = bytearray(secrets.token_bytes(3072))
        chunk = bytes(_random[-6:])
        del _random[-6:]
    return process_id + base64.urlsafe_b64encode(chunk).decode()


def process_alive(pid: int | None) -> bool:
    """Whether process ``pid`` of this machine runs (a zombie not reaped yet does not)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/status") as status:
            return "\nState:\tZ" not in status.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def job_token(job_id: str) -> str:
    """An owner token for ``job_id``: the id, then random (another run of the same job, a
    redelivered copy, must not pass for this one)."""
    return f"{job_id}{JOB_SEPARATOR}{new_token()}"


def current_owner() -> object:
    """The asyncio task running this code, else the current thread: who holds an acquisition."""
    # _get_running_loop, not current_task(): outside a loop that raises, and raising on every
    # sync acquire and release is a measurable share of their cost.
    loop = asyncio._get_running_loop()
    task = asyncio.current_task(loop) if loop is not None else None
    return task if task is not None else threading.current_thread()


def owner_description(owner: object) -> dict[str, str]:
    """How an owner is named in the lock's owner record."""
    if isinstance(owner, asyncio.Task):
        return {"thread": threading.current_thread().name, "task": owner.get_name()}
    name = getattr(owner, "name", None)  # not getattr(..., str(owner)): repr() is costly
    return {"thread": name if name is not None else str(owner)}


class OwnerRecords:
    """The encoded owner records of one lock's acquisitions, built once per owner, process and
    lease: the same for every acquisition a long-lived Lock object makes from one thread (a
    thread may be renamed: checked too, cheaply, since this runs on every acquisition)."""

    def __init__(
        self, *, label: str | None, name: str | None, guard: str | None, group: str | None = None
    ) -> None:
        self.label, self.name, self.guard, self.group = label, name, guard, group
        self._cache: weakref.WeakKeyDictionary[object, tuple[tuple[Any, ...], str]] = (
            weakref.WeakKeyDictionary()
        )

    def encoded(self, owner: object, lease: float) -> str:
        if isinstance(owner, asyncio.Task):
            names: tuple[Any, ...] = (owner.get_name(), threading.current_thread().name)
        else:
            names = (getattr(owner, "name", None),)
        key = (pid, names, lease)
        cached = self._cache.get(owner)
        if cached is not None and cached[0] == key:
            return cached[1]
        record = owner_record(
            owner, lease, label=self.label, name=self.name, guard=self.guard, group=self.group
        ).encode()
        self._cache[owner] = (key, record)
        return record


def owner_record(
    owner: object, lease: float, *, label: str | None, name: str | None, guard: str | None,
    group: str | None = None,
) -> OwnerRecord:  # fmt: skip
    """The owner record of an acquisition by ``owner`` in this process (``name``: the
    readable name, when the key holds only a hash of it)."""
    described = owner_description(owner)
    return OwnerRecord(
        lease=lease, pid=os.getpid(), host=HOST, thread=described["thread"],
        task=described.get("task"), label=label, name=name, guard=guard, group=group,
    )  # fmt: skip


@dataclass(eq=False, slots=True)
class Hold:
    """One owner's acquisition through one Lock object, in the process ``pid`` that made it."""

    token: str
    fence: int | None
    acquired_at: float  # monotonic
    lease: float  # seconds: the latest length the lease was given
    lease_ends_at: float  # monotonic: when the lease ends unless extended, as far as we know
    pid: int
    count: int = 1  # levels held (re-entrant locks count them here, not in Redis)
    next_token: str = ""  # the waiter we expect first in line when we release ('' unknown)
    renewal: RenewedLease | None = None
    lost_reason: str | None = None
    # When a release was first tried (monotonic), until it completes; and whether a try that
    # failed may have run in Redis all the same (sent, and its reply lost or cancelled): a
    # retry that finds the lease gone knows whether it was our own release that got through.
    releasing_since: float | None = None
    release_may_have_run: bool = False
    # What that release keeps for the duplicates (``release(result=...)``: the result and its
    # ms), for a retry: a retry without it would hand the lock to a waiter for the result.
    releasing_with: tuple[Any, ...] = ()
    # Kept alive (renewed, or a short handed lease to lengthen), and its lease deferred to the
    # watchdog's next look (``renewal`` None until then): see background/renewal.start.
    young: bool = False

    def ends_at(self) -> float:
        """When the lease ends (monotonic), by the latest renewal or extension we know of."""
        return self.renewal.expires_at if self.renewal is not None else self.lease_ends_at

    def may_have_ended(self, now: float) -> bool:
        """Whether the lease may have ended in Redis by ``now`` (monotonic): Redis' clock may
        run a little fast (``clock_allowance``)."""
        return now >= self.ends_at() - clock_allowance(self.lease)


class HoldWatch:
    """What the watchdog needs of a hold, without keeping its Lock object or its owner alive:
    whom to tell when the lease is lost, and whether anyone can still release it."""

    def __init__(self, hold: Hold, owner: object, report_lost: Any) -> None:
        """``report_lost``: a bound method ``(hold, reason)`` of the Lock, held weakly (a plain
        weak reference to its object: cheaper to make than a ``WeakMethod``, on every
        acquisition)."""
        self._hold = hold
        self._lock = weakref.ref(report_lost.__self__)
        self._report = report_lost.__func__
        self._owner = weakref.ref(owner)
        self._owner_is_task = isinstance(owner, asyncio.Task)
        # Its name now: the owner may be gone, and collected, by the time anyone asks (a
        # finished task). Only the name: the sentence is made when asked, which is rare.
        self._owner_name: str | None = (
            owner.get_name() if isinstance(owner, asyncio.Task) else getattr(owner, "name", None)
        )

    def lost(self, reason: str) -> None:
        lock = self._lock()
        if lock is not None:
            self._report(lock, self._hold, reason)

    def abandoned(self) -> str | None:
        """Why nobody can release this hold any more (None: someone still may)."""
        if self._lock() is None:
            return "the object that took it was garbage-collected"
        owner: Any = self._owner()
        if owner is None:
            ended = True
        elif self._owner_is_task:
            ended = owner.done()
        else:
            ended = isinstance(owner, threading.Thread) and not owner.is_alive()
        if not ended:
            return None
        if self._owner_name is None:
            return "its owner, which took it, has ended"
        kind = "task" if self._owner_is_task else "thread"
        return f"the {kind} {self._owner_name!r}, which took it, has ended"


class ReentrantHolds:
    """Which hold each thread / task has of each re-entrant lock, across Lock objects, so that
    ``obj.lock()`` called again deeper in the same call stack re-enters the hold: a level more,
    counted here, with no round trip (a thread's re-entry never leaves its process)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._lock = threading.Lock()
        # owner -> lease key -> (the hold, the object that took it, weakly).
        self._holds: weakref.WeakKeyDictionary[
            object, dict[str, tuple[Hold, weakref.ref[object]]]
        ] = weakref.WeakKeyDictionary()

    def get(self, owner: object, key: str) -> Hold | None:
        """``owner``'s hold of ``key``; None (and forgotten) once the object that took it is
        gone: nobody can release that hold any more, so re-entering it would hold nothing."""
        with self._lock:
            held = self._holds.get(owner, {})
            entry = held.get(key)
            if entry is None:
                return None
            if entry[1]() is None:
                del held[key]
                return None
            return entry[0]

    def set(self, owner: object, key: str, hold: Hold, taker: object) -> None:
        with self._lock:
            self._holds.setdefault(owner, {})[key] = (hold, weakref.ref(taker))

    def forget(self, owner: object, key: str, hold: Hold) -> None:
        with self._lock:
            held = self._holds.get(owner, {})
            entry = held.get(key)
            if entry is not None and entry[0] is hold:
                del held[key]


reentrant_holds = ReentrantHolds()


class OwnTokens:
    """The tokens of the holds this process has now, and whose each is: a refusal whose holder
    is one of them says "held by this very thread", not a stranger's name. (Single dict
    operations, atomic under the GIL: an acquisition takes no lock for this.)"""

    def __init__(self) -> None:
        self._owners: dict[str, weakref.ref[object]] = {}

    def add(self, token: str, owner: object) -> None:
        self._owners[token] = weakref.ref(owner)

    def discard(self, token: str) -> None:
        self._owners.pop(token, None)

    def holds(self, owner: object, value: Any) -> bool:
        """Whether the lease value ``value`` (a holder's, read from Redis) is a hold of
        ``owner``'s, in this process."""
        token = holder_token(value)
        held = self._owners.get(token) if token is not None else None
        return held is not None and held() is owner

    def clear(self) -> None:
        self._owners = {}


own_tokens = OwnTokens()


class Strays:
    """The places in a lock's line this process left behind: an acquisition that could not
    step out of the line (Redis unreachable, its connection cut: a failover, a network blip)
    leaves its token queued, counted alive for up to a block and a second, and whoever queued
    behind it waits that long. The next acquisition of that lock in this process steps it out
    first (``flows.AcquirePlan.strays``). A token is kept until the queue would skip it anyway.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, list[tuple[str, float]]] = {}

    def left(self, plan: Any, token: str, until: float) -> None:
        """``plan``'s acquisition could not step ``token`` out of its lock's line; the queue
        counts it alive until ``until`` (monotonic)."""
        with self._lock:
            self._by_key.setdefault(plan.keys.lease, []).append((token, until))

    def waiting(self, key: str) -> bool:
        """Whether tokens of this process may be left in the line of the lock whose lease is
        ``key`` (a dict lookup, none when there are none)."""
        return bool(self._by_key) and key in self._by_key

    def take(self, key: str, now: float) -> tuple[tuple[str, float], ...]:
        """The tokens left in the line of the lock whose lease is ``key`` and still counted
        alive at ``now``, forgotten here (an acquisition steps them out). Costs a dict lookup
        when there are none, on every acquisition."""
        if not self._by_key:
            return ()
        with self._lock:
            taken = self._by_key.pop(key, [])
            for other, entries in list(self._by_key.items()):  # forget the lapsed, all locks
                entries[:] = [entry for entry in entries if entry[1] > now]
                if not entries:
                    del self._by_key[other]
        return tuple(entry for entry in taken if entry[1] > now)

    def clear(self) -> None:
        self._lock = threading.Lock()
        self._by_key = {}


strays = Strays()


def _after_fork_in_child() -> None:
    global pid, process_id
    pid = os.getpid()
    process_id = _process_id()
    # The parent's holds: re-entering one would join the parent's hold.
    reentrant_holds.clear()
    own_tokens.clear()
    strays.clear()
    global _random, _random_lock
    _random, _random_lock = bytearray(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
