"""The uncontended acquisition and release, as plain functions: what taking a free lock sends
(a bare ``SET NX PX``) and what its reply means; what a release sends (``release.lua``) and
what its reply asks for next.

The most common operation of all, a lock nobody else wants, is one ``SET`` and one script call;
wrapped in a plan and a flow it paid several microseconds of Python for the wrapping. So the
primitives take a free lock and release it through these functions directly (``flat``), and
the flows (``flows.acquire``, ``release.release``) are built on the same functions: the
decisions are made in one place, and anything past "the lock was free" (it is held: wait in
line; the reply came too late; a waiter to wake) goes on through the flows.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .layout import KeyLayout
from .requests import Eval

__all__ = [
    "FREE_WAKE_MS",
    "LOST_RACE_RETRY_MS",
    "REPLY_FLOOR",
    "STARVATION_BOUND_MS",
    "WAKE",
    "learnt_late",
    "lease_value",
    "release_request",
    "released",
    "reply_budget",
    "take_free",
    "text",
]

# fair=False: a waiter is served ahead of the releaser and newcomers once it has waited this
# long (the bound on its starvation); until then a release leaves the lock free, and wakes it.
STARVATION_BOUND_MS = 250
# How long an empty wake-up (the lock left free, fair=False) waits on its list, ms.
FREE_WAKE_MS = 1000
# The script that pushes the wake-ups a release asks for (backends/lua/wake.lua).
WAKE = "wake"
# fair=False: a woken waiter that lost the race for the free lock (the releaser came back
# first) asks again on its own this soon, ms; until then releases leave the lock free without
# waking it again. On a busy lock that is most wake-ups, each a process woken for nothing.
LOST_RACE_RETRY_MS = 5

# The least time an acquisition gives Redis to answer one request, however short its wait: a
# busy server is not a dead one. (Shorter socket timeouts still apply.)
REPLY_FLOOR = 1.0


def text(value: Any) -> str:
    """A reply as ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def reply_budget(remaining: float) -> float | None:
    """How long one request of an acquisition may go unanswered: the wait left, but at least
    REPLY_FLOOR (None: for ever, and the socket timeout decides). So acquire(wait=1) against
    a stalled Redis gives up after about a second."""
    return None if remaining == math.inf else max(remaining, REPLY_FLOOR)


def lease_value(token: str, record: str, fence: str = "0") -> str:
    """A lease as the taking client writes it (``lease.py``): since when, by its own clock."""
    return f"{token}|{int(time.time() * 1000)}|{fence}|{record}"


def take_free(key: str, token: str, record: str, lease_ms: int) -> tuple[Any, ...]:
    """The command that takes a free lock, and nothing else: its reply is not None when it
    did (then the lease runs ``lease_ms`` from when it was sent, at the latest)."""
    return ("SET", key, lease_value(token, record), "NX", "PX", lease_ms)


def learnt_late(sent_at: float, lease_ms: int, now: float) -> bool:
    """A grant (sent at ``sent_at``, monotonic) learnt of only after the lease it gave had ended
    by our own clock (this process was paused, or the reply was that slow): the lock may be
    another's by now, and the work must not start on it. Ask again: the lease is found ours,
    and lengthened, or it is waited for as any waiter does."""
    return now >= sent_at + lease_ms / 1000


def release_request(
    keys: KeyLayout,
    token: str,
    expected: str,
    keep: tuple[Any, ...] = (),
    *,
    unfair_ms: int = 0,
    reply_timeout: float | None = None,
    cleanup: bool = False,
) -> Eval:
    """The release of the lease ``token`` holds (``release.lua``): handed to the first live
    waiter (``expected``: the one we think is first), or deleted. ``keep``: the guarded work's
    result and how long to keep it, ms, for duplicates. ``unfair_ms`` (a lock taken with
    ``fair=False``: ``STARVATION_BOUND_MS``): the first waiter is only woken, to compete for the
    free lock, until it has waited that long."""
    args = (token, expected, str(unfair_ms) if unfair_ms else "", *keep)
    return Eval(
        keys.RELEASE, keys.release_keys(expected, token), args if keep or unfair_ms else args[:2],
        reply_timeout=reply_timeout, cleanup=cleanup,
    )  # fmt: skip


def released(keys: KeyLayout, reply: Any) -> tuple[int, Eval | None, str]:
    """What a release's reply means: 0 (released, or handed on), -1 (not ours: nothing
    touched) or -2 (the key is not a lock); the request that wakes the waiters it was handed
    to without expecting them (``wake.lua``; a semaphore's release may hand several permits),
    to send next, or None; and the first waiter it handed to or woke ('' none). Nothing
    depends on that push but how soon they know: if it is late or fails, each finds the lease
    its own when its block ends and it asks again, and join.lua answers with the same message
    made again from the lease, the queue and the kept result."""
    code = int(reply) if isinstance(reply, int) else int(reply[0])
    if code == 1:  # (a semaphore's release says whom it woke in its script: nobody here)
        return 0, None, text(reply[1]) if len(reply) > 1 else ""
    if code != 2:
        return code, None, ""
    lists: list[str] = []
    args: list[Any] = []
    for head, message in zip(reply[1::2], reply[2::2], strict=True):
        lists.append(keys.wake(text(head)))
        message = text(message)
        # (An empty message: the lock was left free for it to compete for, fair=False.)
        args += (message, int(message.split("|", 2)[1]) if message else FREE_WAKE_MS)
    return 0, Eval(WAKE, tuple(lists), tuple(args), cleanup=True), text(reply[1])
