"""Labels of bounded cardinality: a lock's *group* and why a lease was lost.

A group is what a dashboard sums over: ``model:shop.order``, ``view:checkout``,
``task:sync_customer``. The guards and ``Lock(..., group=...)`` say it; a plain name falls back to
its leading parts that name a kind of thing rather than one thing (``import:42`` -> ``import``).
Whatever the names, a process reports at most ``MAX_GROUPS`` groups: past that, ``other``.
"""

from __future__ import annotations

import logging
import threading

__all__ = [
    "ACQUIRED",
    "DONE",
    "ERROR",
    "MAX_GROUPS",
    "OTHER",
    "TIMED_OUT",
    "bounded",
    "group_of",
    "reason_kind",
]

logger = logging.getLogger("django_redis_lock")

# A wait's outcomes (the metrics' ``outcome`` label)...
ACQUIRED, TIMED_OUT, ERROR = "acquired", "timed_out", "error"
# ...and, for ``lock_not_acquired`` only, a wait for the holder's result that got it: not a
# wait that failed, so the metrics do not count it as one.
DONE = "done"

MAX_GROUPS = 200
OTHER = "other"
_MAX_PART = 40

_seen: set[str] = set()
_seen_lock = threading.Lock()


def group_of(name: str) -> str:
    """The group of a lock named ``name`` that was given none: its first parts (split on
    ``:``) up to the first that looks like an id (a digit in it, a hash tag, a long one), at
    most three; ``other`` when the first already does."""
    parts: list[str] = []
    for part in name.split(":"):
        if (
            not part
            or len(part) > _MAX_PART
            or "{" in part
            or any(char.isdigit() or char.isspace() for char in part)
        ):
            break
        parts.append(part)
        if len(parts) == 3:
            break
    return ":".join(parts) or OTHER


def bounded(group: str) -> str:
    """``group``, or ``other`` once this process has reported ``MAX_GROUPS`` others (names
    that carry ids where the fallback cannot see them, say: a WARNING tells, once)."""
    if group in _seen:
        return group
    with _seen_lock:
        if len(_seen) >= MAX_GROUPS:
            if OTHER not in _seen:
                _seen.add(OTHER)
                logger.warning(
                    "Lock metrics: more than %d groups in this process; the rest are counted as "
                    "%r. Give locks a group (Lock(..., group='import:{feed_id}')).",
                    MAX_GROUPS, OTHER,
                )  # fmt: skip
            return OTHER
        _seen.add(group)
    return group


def reason_kind(reason: str) -> str:
    """The kind of a loss's reason (free text, for people): ``expired`` (the lease ended or was
    gone: expired, evicted, force-released), ``unreachable`` (Redis could not be reached to
    renew it), ``abandoned``, or ``other``."""
    text = reason.lower()
    if "reach" in text or "connection" in text or "timeout" in text or "error" in text:
        return "unreachable"
    if "gone" in text or "ended" in text or "expired" in text or "not ours" in text:
        return "expired"
    if "abandon" in text or "collected" in text:
        return "abandoned"
    return OTHER
