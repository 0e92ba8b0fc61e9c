"""Whether a lease's holder is a process known to be dead: the rules, without I/O.

A lease ends by itself when its holder dies: at the latest when the lease runs out (30 s by
default). Often a waiter can know much sooner. Every token this library makes starts with the
id of the process that made it (``PROCESS_ID_LENGTH`` characters), and a process that holds
locks keeps a record of itself in Redis under that id (:class:`ProcessRecord`: where it runs,
its pid and when it started). A waiter that reads the record of the holder it waits behind and
finds itself in the same place (the same boot of the same kernel, and the same PID namespace:
not merely the same host name, which containers share) can look the holder up in its own
``/proc``: a pid that is gone, or that is now another process (another start time), is a dead
holder. Then the waiter ends exactly that holder's lease (``release.lua`` with the dead
holder's token: the lease goes to the first live waiter, atomically, and only if it is still
that holder's), and takes its turn.

Anything less than certainty leaves the lease to end by itself: no record (an older version's
token, a job's reservation, a record that expired), another boot or namespace, a ``/proc``
that cannot be read. Never the reverse: a live holder is never cut short.
"""

from __future__ import annotations

from dataclasses import dataclass

from .lease import JOB_SEPARATOR, is_reservation

__all__ = [
    "PROCESS_ID_LENGTH",
    "RECORD_AGAIN",
    "RECORD_SECONDS",
    "TOKEN_LENGTH",
    "ProcessRecord",
    "dead",
    "process_of",
]

# A token (``owners.new_token``): the process's id, then the acquisition's own random part.
PROCESS_ID_LENGTH = 8
TOKEN_LENGTH = 16
# How long a process's record lives in Redis. A process writes it again at its first acquisition
# after RECORD_AGAIN: a Redis restarted empty (or flushed) has it back within minutes.
RECORD_SECONDS = 3600
RECORD_AGAIN = 300


def process_of(token: str) -> str | None:
    """The id of the process that made ``token``, or None: a job's reservation (no process
    holds it), or a token of another shape (an older version's, another library's)."""
    if is_reservation(token):
        return None
    own = token.rpartition(JOB_SEPARATOR)[2]  # a hold for a job: <job id>~<random>
    return own[:PROCESS_ID_LENGTH] if len(own) == TOKEN_LENGTH else None


@dataclass(frozen=True)
class ProcessRecord:
    """Where a process runs and which one it is. ``place``: its kernel's boot id and its PID
    namespace (``boot id/device:inode``); ``started``: its start time, in clock ticks since
    boot (``/proc/<pid>/stat``), which tells a reused pid from the process."""

    place: str
    pid: int
    started: str

    def encode(self) -> str:
        return f"{self.place}|{self.pid}|{self.started}"

    @classmethod
    def decode(cls, value: str | bytes | None) -> ProcessRecord | None:
        """The record in ``value`` (None: none, or not one of ours)."""
        if value is None:
            return None
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        place, _, rest = text.partition("|")
        pid, _, started = rest.partition("|")
        if not place or not pid.isdigit() or not started.isdigit():
            return None
        return cls(place, int(pid), started)


def dead(record: ProcessRecord, here: str | None, started_now: str | None) -> bool:
    """Whether the process of ``record`` is dead, seen from a process whose place is ``here``
    (None: unknown, e.g. no ``/proc``) that finds its pid ``started_now`` (None: no such
    process, or a zombie: exited, not yet reaped). Only in the same place can a pid be looked
    up at all; there, a pid that is gone, or was started at another time, is not the holder."""
    return here is not None and record.place == here and started_now != record.started
