"""What a quorum's replies say, read without I/O: a script's reply by the code it carries
(a grant, a release's code, a fence), and the reads a majority must agree on (``EXISTS``,
``GET``, ``PTTL``). ``client.py`` counts the votes; this reads each one."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = [
    "READS",
    "agreed_lease",
    "exists",
    "fence_of",
    "is_list",
    "majority_pttl",
    "release_code",
]


def is_list(reply: Any) -> bool:
    return isinstance(reply, list)


def release_code(reply: Any) -> int:
    """A release.lua reply's code (a number, or a list's first); -3 for anything else (an
    error, no answer)."""
    if isinstance(reply, int) and not isinstance(reply, bool):
        return reply
    return int(reply[0]) if is_list(reply) else -3


def fence_of(reply: Any) -> int:
    """The fencing token in a grant of take.lua (none in a SET's)."""
    return int(reply[1]) if is_list(reply) else 0


def exists(answers: list[Any], majority: int) -> int:
    return int(sum(int(answer) for answer in answers) >= majority)


def agreed_lease(answers: list[Any], majority: int) -> Any:
    """The lease a majority agrees on: the same token (each server wrote its own ``since``
    and fence), or None."""
    tokens = [
        answer.split(b"|", 1)[0] if isinstance(answer, bytes) else None for answer in answers
    ]
    for answer, token in zip(answers, tokens, strict=True):
        if token is not None and tokens.count(token) >= majority:
            return answer
    return None


def majority_pttl(answers: list[Any], majority: int) -> int:
    # The lease lasts as long as a majority still has it: the majority-th longest. A key
    # without an expiry (-1) lasts longest of all, and is not hidden as "no key" (-2).
    pttls = [int(answer) for answer in answers]
    pttl = sorted(pttls, key=lambda ms: math.inf if ms == -1 else ms, reverse=True)[majority - 1]
    return pttl if pttl >= -1 else -2


READS: dict[str, Callable[[list[Any], int], Any]] = {
    "EXISTS": exists,
    "GET": agreed_lease,
    "PTTL": majority_pttl,
}
