"""A lease as Redis stores it: one string, ``token|since_ms|fence|owner record``.

A token is random (``owners.new_token``), or a job's: ``<job id>~<random>`` for a hold of a run
of the job, ``<job id>~queued`` for the job's reservation while it waits in a queue.

One string rather than a hash: a free lock is taken with a bare ``SET key value NX PX ms``, and a
held lock costs about 200 bytes of Redis memory (a hash with a JSON owner record cost 600).

The owner record is positional, for people (the admin page, ``redis_locks``, the holder named
in ``LockNotAcquired``): ``lease_ms|pid|host|thread|task|label|name``, then ``|guard`` when a
task guard holds the lock (what it guards: ``until_executed``...), then ``|group`` when the
holder named the lock's metrics group (``Lock(..., group=...)``, the guards): read back by the
scrape-time gauges, which have no Lock object to ask. Text fields have ``%`` and
``|`` escaped; an empty field is "none". ``name`` is only written when the lock's key holds a
hash of its name (``primitives/keys.py``); otherwise the key shows it. A reader ignores fields
after those it knows (a newer version's), so a record can grow without a rolling deploy's older
processes calling it unreadable. ``since_ms`` is when the lease was taken: by the taking
client's clock for a bare ``SET``, the server's when a script wrote it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar

__all__ = [
    "JOB_SEPARATOR",
    "PENDING_JOB",
    "RESERVED",
    "Lease",
    "LockKeys",
    "OwnerRecord",
    "decode_lease",
    "encode_lease",
    "held_by",
    "holder_token",
    "is_reservation",
    "job_id_checked",
    "job_of",
    "reservation_token",
    "takeover_prefixes",
    "text_of",
]


# A job id ends where the rest of its tokens begins: the random part of a hold's, or RESERVED.
JOB_SEPARATOR = "~"
# The token of a job's reservation is "<job id>~queued": one per job, known to every process
# that knows the job's id (a reservation is taken when the job is queued, by the process that
# queues it, and taken over by the process that runs it; see ``task_guards/reservations.py``).
RESERVED = "queued"
# The job id of a reservation made before its job's id is known (django.tasks backends name
# a task when they queue it): "pending.<random>", renamed once the id is known.
PENDING_JOB = "pending."


# Whitespace, the token's separators, and lone surrogates (no UTF-8 for them: Redis could not
# be sent a token or a key made of one).
_NOT_IN_JOB_IDS = re.compile("[\\s|~\ud800-\udfff]")


def job_id_checked(job_id: object) -> str:
    """``job_id`` if it can start a token (``TypeError`` / ``ValueError`` otherwise)."""
    if not isinstance(job_id, str):
        raise TypeError(
            f"job_id must be a str (a task's or job's id), not {type(job_id).__name__}."
        )
    if not job_id or len(job_id) > 128 or _NOT_IN_JOB_IDS.search(job_id):
        raise ValueError(
            f"job_id must be 1-128 characters with no whitespace, '|', '~' or lone surrogate, "
            f"not {job_id!r}."
        )
    return job_id


def reservation_token(job_id: str) -> str:
    """The token of ``job_id``'s reservation (the same in every process)."""
    return f"{job_id}{JOB_SEPARATOR}{RESERVED}"


def job_of(token: str) -> str | None:
    """The job id a token was made for (``owners.job_token``, :func:`reservation_token`), or
    None."""
    job_id, separator, _ = token.partition(JOB_SEPARATOR)
    return job_id if separator else None


def is_reservation(token: str) -> bool:
    """Whether ``token`` is a job's reservation (it waits in a queue) rather than a hold."""
    return token.endswith(JOB_SEPARATOR + RESERVED)


def takeover_prefixes(job_id: str) -> tuple[str, ...]:
    """The lease values a hold for ``job_id`` takes over as if the lock were free: the job's
    own reservation, and a pending one (made for a job whose id was not known yet, which can
    only be the job that runs now: a key has one reservation at a time)."""
    return (reservation_token(job_id) + "|", PENDING_JOB)


def _escape(text: str | None) -> str:
    if not text:
        return ""
    if "%" in text or "|" in text:
        return text.replace("%", "%25").replace("|", "%7C")
    return text


def _unescape(text: str) -> str | None:
    if not text:
        return None
    if "%" in text:
        return text.replace("%7C", "|").replace("%25", "%")
    return text


@dataclass(frozen=True)
class OwnerRecord:
    """Who holds (or waits for) a lock, as written in its lease."""

    lease: float  # seconds
    pid: int
    host: str
    thread: str
    task: str | None = None
    label: str | None = None
    name: str | None = None
    guard: str | None = None
    group: str | None = None

    def encode(self) -> str:
        fields = [
            str(max(1, round(self.lease * 1000))),
            str(self.pid),
            _escape(self.host),
            _escape(self.thread),
            _escape(self.task),
            _escape(self.label),
            _escape(self.name),
        ]
        # Absent otherwise: a plain lock's record stays as short as it was.
        if self.guard or self.group:
            fields.append(_escape(self.guard))
        if self.group:
            fields.append(_escape(self.group))
        return "|".join(fields)

    @classmethod
    def decode(cls, text: str) -> OwnerRecord:
        """Raises ``ValueError`` for a record this module did not write."""
        fields = text.split("|")
        if len(fields) < 7:
            raise ValueError(f"an owner record has at least 7 fields, not {len(fields)}")
        lease_ms, pid, host, thread, task, label, name = fields[:7]
        return cls(
            lease=int(lease_ms) / 1000,
            pid=int(pid),
            host=_unescape(host) or "",
            thread=_unescape(thread) or "",
            task=_unescape(task),
            label=_unescape(label),
            name=_unescape(name),
            guard=_unescape(fields[7]) if len(fields) > 7 else None,
            group=_unescape(fields[8]) if len(fields) > 8 else None,
        )


@dataclass(frozen=True)
class Lease:
    """A lease value, decoded."""

    token: str
    since_ms: int
    fence: int  # 0: not fenced
    owner: OwnerRecord

    @property
    def acquired_at(self) -> datetime:
        return datetime.fromtimestamp(self.since_ms / 1000, tz=timezone.utc)

    def describe(self, name: str | None = None) -> dict[str, Any]:
        """The holder as a dict (``LockNotAcquired.owner``, signals)."""
        owner = self.owner
        described: dict[str, Any] = {
            "name": owner.name or name,
            "label": owner.label,
            "host": owner.host,
            "pid": owner.pid,
            "thread": owner.thread,
            "lease": owner.lease,
            "acquired_at": self.since_ms / 1000,
        }
        if owner.task:
            described["task"] = owner.task
        if owner.guard:
            described["guard"] = owner.guard
        job_id = job_of(self.token)
        if job_id is not None:
            described["job_id"] = job_id
            described["queued"] = is_reservation(self.token)
        return described


def encode_lease(token: str, since_ms: int, fence: int, record: str) -> str:
    """The value of a lease (``record``: an :meth:`OwnerRecord.encode`)."""
    return f"{token}|{since_ms}|{fence}|{record}"


def text_of(value: bytes | str) -> str:
    """A value of ours as text. Names may hold lone surrogates (a Python str may), which the
    wire sends with ``surrogatepass`` (``wire.pack``): read them back the same way, or the
    name read back is not the name (another key, and nothing found by it). Bytes that are no
    UTF-8 at all (not written by us) are kept readable, escaped."""
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return value.decode("utf-8", "surrogateescape")


def decode_lease(value: bytes | str) -> Lease:
    """Raises ``ValueError`` for a value that is not a lease of ours."""
    text = text_of(value)
    parts = text.split("|", 3)
    if len(parts) != 4 or not parts[0]:
        raise ValueError("not a lease: expected token|since|fence|record")
    token, since, fence, record = parts
    return Lease(token, int(since), int(fence), OwnerRecord.decode(record))


def holder_token(value: bytes | str | None) -> str | None:
    """The token of the lease value ``value`` (None: no lease, or not a lease of ours)."""
    if value is None:
        return None
    token, separator, _ = text_of(value).partition("|")
    return token if separator and token else None


def held_by(value: bytes | str | None, token: str) -> bool:
    """Whether the lease value ``value`` (None: no lease) carries ``token``."""
    if value is None:
        return False
    prefix = token + "|"
    if isinstance(value, bytes):
        return value.startswith(prefix.encode())
    return value.startswith(prefix)


def seconds_left(pttl: int) -> float | None:
    """A ``PTTL`` reply in seconds: None for no key, ``math.inf`` for a key without expiry."""
    if pttl == -2:
        return None
    return math.inf if pttl == -1 else pttl / 1000


@dataclass(frozen=True)
class LockKeys:
    """The keys of one lock (``primitives/keys.py`` names them): the lease, and the queue keys
    that exist while someone waits.

    A :class:`~django_redis_lock.core.layout.KeyLayout`, as a semaphore's
    ``permits.PermitKeys`` is: what the flows need to know of a primitive."""

    lease: str
    queue: str
    waiters: str
    result: str
    wake_prefix: str

    TAKE: ClassVar[str] = "take"
    JOIN: ClassVar[str] = "join"
    RELEASE: ClassVar[str] = "release"
    EXTEND: ClassVar[str] = "extend"

    @classmethod
    def of(cls, lease: str) -> LockKeys:
        """The keys of the lock whose lease is ``lease`` (they share its hash tag)."""
        return cls(lease, f"{lease}:q", f"{lease}:d", f"{lease}:r", f"{lease}:w:")

    def wake(self, token: str) -> str:
        return self.wake_prefix + token

    def result_of(self, token: str) -> str:
        """Where the guarded work's result is kept for the holder ``token``: the lock's own
        key, but a job's own one (``<lease>:r:<job id>~``) when ``token`` is a job's (a task
        guard's run), so that a copy of a job the broker delivers again finds its job's record
        even after a later job of the same key has finished. (It ends with ``~``, never with
        ``}``: the census takes no result for a lease.)"""
        job = job_of(token)
        return self.result if job is None else f"{self.result}:{job}{JOB_SEPARATOR}"

    def release_keys(self, expected: str, token: str = "") -> tuple[str, ...]:
        """The keys ``release.lua`` is given by the holder ``token`` (its result's key),
        expecting ``expected`` first in line."""
        wake = self.wake(expected) if expected else self.wake_prefix
        return (self.lease, self.queue, self.waiters, wake, self.result_of(token))

    def extend_keys(self) -> tuple[str, ...]:
        return (self.lease,)

    def take_call(self, plan: Any, flags: str) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """``take.lua``'s keys and arguments for ``plan`` (a ``flows.AcquirePlan``). One key
        unless the result is wanted: on a Redis Cluster slot being moved, a script with several
        keys waits for the move to end (TRYAGAIN) unless all are on one side."""
        keys = (self.lease, self.result_of(plan.token)) if plan.want_result else (self.lease,)
        return keys, (plan.token, plan.lease_ms, plan.record, flags, *plan.takeover)

    def join_call(
        self, plan: Any, mode: int, flags: str, liveness_ms: int
    ) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """``join.lua``'s keys and arguments."""
        keys = (
            self.lease, self.queue, self.waiters, self.wake(plan.token),
            self.result_of(plan.token),
        )  # fmt: skip
        args = (plan.token, plan.lease_ms, plan.record, mode, flags, liveness_ms, *plan.takeover)
        return keys, args
