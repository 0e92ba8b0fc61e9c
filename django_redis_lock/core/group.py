"""``lock_many``'s one step of its own: take the free locks of a group in one script
(``take_many.lua``), in the group's order, up to the first that someone else holds. The rest of
a group's acquisition is each member's own (``flows.acquire``), in the same order, so that
callers naming the same locks in any order never deadlock (``primitives/group.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .flows import AcquirePlan
from .release import give_back, release
from .replies import Acquired
from .requests import Eval, Flow
from .uncontended import reply_budget

__all__ = ["TakenInOrder", "take_in_order"]

# The script's name (scripts.TAKE_MANY is the script itself).
_SCRIPT = "take_many"


@dataclass(slots=True)
class TakenInOrder:
    """What ``take_many.lua`` took: one grant for each of the first ``len(acquired)`` plans;
    ``holder`` and ``pttl``: the next one's holder (its lease value) and the ms it has left."""

    acquired: list[Acquired]
    holder: Any
    pttl: int


def take_in_order(plans: Sequence[AcquirePlan]) -> Flow:
    """Returns :class:`TakenInOrder`. The plans share one lease length and one hash slot (the
    caller checked: ``Backend.one_script``). On an error, or a cancellation, before the reply
    was read, each lease is given back (a lease that is not ours is left alone): the script
    may have run. A reply that does not come in time is followed by those give-backs on its
    connection (the request's ``give_back``): Redis runs them right after it."""
    first = plans[0]
    wait = first.max_wait
    args = (first.lease_ms, *(part for plan in plans for part in (plan.token, plan.record)))
    sent_at = first.clock()
    try:
        reply = yield Eval(
            _SCRIPT,
            tuple(plan.keys.lease for plan in plans),
            args,
            reply_timeout=reply_budget(wait),
            # Each lease it may have granted, given back should its reply not come in time.
            give_back=tuple(give_back(plan.keys, plan.token) for plan in reversed(plans)),
        )
    except GeneratorExit:
        raise  # closed by its owner: nothing more may be sent
    except BaseException as error:
        if not first.unreachable(error):
            for plan in reversed(plans):
                try:
                    yield from release(plan.keys, plan.token, "", cleanup=True)
                except Exception:
                    break  # Redis is not answering: each lease ends by itself
        raise
    taken = int(reply[0])
    acquired = [Acquired(0, plan.lease_ms, sent_at, "") for plan in plans[:taken]]
    return TakenInOrder(acquired, reply[2] or None, int(reply[1]))
