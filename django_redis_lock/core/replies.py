"""What the scripts answer an acquisition (``flows.py``), read: the outcomes a flow returns,
a grant's and a queue join's replies (``take.lua``, ``join.lua``, ``permit_acquire.lua``), and
a release's wake-up message (``release.lua``, ``permit_release.lua``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .release import text

__all__ = [
    "Acquired",
    "Done",
    "NotAcquired",
    "ahead_ms",
    "from_message",
    "joined_us",
    "other_limit",
    "until_it_matters",
]


@dataclass(slots=True)
class Acquired:
    fence: int
    lease_ms: int  # what the lease was given: shorter than asked when handed over by a release
    sent_at: float  # the lease runs from no earlier than this (monotonic)
    next_token: str  # the waiter first in line after us, as far as we know ('' none)
    done: bool = False  # the guarded work's result is there (want_result): release, read it
    other_limit: int = 0  # a semaphore's: another holder took its permit under this limit


@dataclass(slots=True)
class NotAcquired:
    holder: Any  # the holder's lease value as first seen, when asked for (else None)
    pttl: int  # ms left on the holder's lease, when known (else 0)


@dataclass(slots=True)
class Done:
    result: bytes


def from_message(message: Any, sent_at: float) -> tuple[Acquired, int]:
    """A release's wake-up message, ``fence|lease_ms|done|handed at µs|next token``, and when
    it was handed (server µs; 0 in an older version's message, which has no such field)."""
    fields = text(message).split("|", 4)
    handed = int(fields.pop(3)) if len(fields) == 5 else 0
    fence, lease_ms, done, next_token = fields
    return Acquired(int(fence), int(lease_ms), sent_at, next_token, done == "1"), handed


def other_limit(reply: Any) -> int:
    """A semaphore's grant: the limit another holder took its permit under, when not ours."""
    return int(reply[4]) if len(reply) > 4 else 0


def ahead_ms(reply: Any) -> int:
    """A queue join's ``ahead_ms``: until the first live waiter ahead is counted dead (0:
    none)."""
    return int(reply[3]) if len(reply) > 3 else 0


def joined_us(reply: Any) -> int:
    """A queue join's time, by the server's clock in µs (0: an older version's reply)."""
    return int(reply[4]) if len(reply) > 4 and reply[4] else 0


def until_it_matters(reply: Any) -> float:
    """After a queue join's reply: a block lasts at most until the holder's lease ends (it may
    have died without releasing), or the first live waiter ahead of us is counted dead, a
    millisecond more."""
    if int(reply[0]) != 0:
        return math.inf
    ends = [ms / 1000 + 0.001 for ms in (int(reply[1]), ahead_ms(reply)) if ms > 0]
    return min(ends, default=math.inf)
