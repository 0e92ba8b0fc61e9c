"""The lock operations as flows: generators that yield requests (``requests.py``) and receive
replies, and return an outcome. They decide everything (what to send, what a reply means, how
long to block, when to give up, how to step out of the queue on an error) and do no I/O: a
sync and an async driver (``backends/drivers.py``) carry them out, so the two cannot drift
(httpx's ``auth_flow``). Time comes from ``plan.clock``, so tests drive a flow with a fake
clock and canned replies. What the scripts' replies and the wake-up messages say, and the
outcomes, are read in ``replies.py``.

Acquiring (``acquire``):

1. a free lock is taken with a bare ``SET NX PX`` (``plan.first``), else ``take.lua`` (fencing,
   results: one key, so it works on a Redis Cluster slot being moved too) or, for a lock seen
   contended lately, straight away by ``join.lua``;
2. if it is held and we may wait, ``join.lua`` queues us and we block on our wake-up list;
   the holder's release hands us the lease and pushes a message there, so we hold the lock when
   we wake (or, should the message be late or lost, when we ask again: ``join.lua`` says what
   it said; a message handed before our latest join is a late one, whose lease ended, and is
   ignored). A block ends at the latest when the wait does, or when the holder's lease does (it
   may have died without releasing), or when the waiter ahead of us would be counted dead (it
   may have died, and been handed the lease), and every ``BLOCK_CAP`` seconds so the queue
   keeps counting us alive. A wait cut off in the line that could not step out of it is
   stepped out by this process's next acquisition of the lock (``AcquirePlan.strays``). A
   waiter of a ``fair=False`` lock woken to compete for it asks with ``RETRY``: the lock if it
   is free, else its place kept as it is;
3. without a queue (quorum mode), we look again after a short random delay.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

from .lease import LockKeys
from .plan import AcquirePlan
from .release import Unconfirmed, WaitRefused, end_reservation, extend, give_back, release
from .replicas import check_replicas, confirm_handoff, confirmed
from .replies import (
    Acquired,
    Done,
    NotAcquired,
    ahead_ms,
    from_message,
    joined_us,
    other_limit,
    until_it_matters,
)
from .requests import Block, Command, Eval, Flow, Pipeline, Sleep
from .uncontended import LOST_RACE_RETRY_MS, learnt_late, reply_budget, take_free

__all__ = [
    "BLOCK_CAP",
    "HANDOFF_MS",
    "AcquirePlan",
    "Acquired",
    "Done",
    "Flow",
    "LockKeys",
    "NotAcquired",
    "Unconfirmed",
    "WaitRefused",
    "acquire",
    "end_reservation",
    "extend",
    "release",
]


# The longest single block on a wake-up list. A waiter's liveness deadline is one block plus
# LIVENESS_SLACK after it last asked: the longest a waiter that died unannounced stays first in
# line, and the longest it holds up those behind it (see HANDOFF_MS).
BLOCK_CAP = 2.0
LIVENESS_SLACK = 1.0
# A lease a release hands to a waiter lasts at most this long, and never past the waiter's
# liveness deadline, until its new holder lengthens it (a join that finds it handed, its
# renewal, or a one-off top-up). A live waiter is blocked on its wake-up list, whose deadline is
# at least LIVENESS_SLACK away, or about to ask again, and takes over within a round trip.
HANDOFF_MS = 3000
# Below this, a wait is not worth a blocking call: BLPOP's timeout 0 would mean "for ever".
MIN_BLOCK = 0.001
# Without a queue (quorum mode), a waiter looks again after a random delay in this range.
RETRY_DELAY = (0.005, 0.03)
# join.lua's modes. RETRY (fair=False): take a free lock, else keep our place as it is.
QUEUE, TAKE_OR_LEAVE, LEAVE, RETRY = 1, 2, 3, 4


def acquire(plan: AcquirePlan) -> Flow:
    """Returns :class:`Acquired`, :class:`NotAcquired` or :class:`Done`; raises
    :class:`Unconfirmed` when replicas did not confirm a grant (given back first)."""
    keys, token, clock = plan.keys, plan.token, plan.clock
    for stray, until in plan.strays:
        if not (yield from _leave(replace(plan, token=stray, strays=()))) and until > clock():
            plan.strayed(plan, stray, until)  # still unreachable: the next one tries again
    deadline = plan.started + plan.max_wait
    first = "take" if plan.takeover and plan.first == "set" else plan.first  # SET takes none
    if first == "set":
        sent_at = clock()
        reply = yield Command(
            take_free(keys.lease, token, plan.record, plan.lease_ms),
            reply_timeout=reply_budget(deadline - sent_at),
            give_back=give_back(keys, token),
        )
        if reply is not None:
            granted = Acquired(0, plan.lease_ms, sent_at, "")
            return granted if not _learnt_late(plan, granted) else (yield from _again(plan))
        if deadline <= clock() and plan.queues:  # who holds it, for the caller's error
            holder, pttl = yield Pipeline((("GET", keys.lease), ("PTTL", keys.lease)))
            for answer in (holder, pttl):
                if isinstance(answer, BaseException):
                    raise answer
            return NotAcquired(holder, int(pttl))
    outcome: Any = Waiting()
    if first == "take" or not plan.queues:
        outcome = yield from _poll(plan)
    if isinstance(outcome, Waiting):  # (held, and we may wait in line for it)
        outcome = yield from _wait_in_line(plan)
    return outcome if not _learnt_late(plan, outcome) else (yield from _again(plan))


def _learnt_late(plan: AcquirePlan, outcome: Any) -> bool:
    """A grant learnt of too late (``uncontended.learnt_late``)."""
    return isinstance(outcome, Acquired) and learnt_late(
        outcome.sent_at, outcome.lease_ms, plan.clock()
    )


def _again(plan: AcquirePlan) -> Flow:
    """Ask again after a grant learnt of too late: join.lua (take.lua without a queue) finds
    the lease still ours, and lengthens it, or waits in line as any waiter does."""
    while True:
        outcome = yield from (_wait_in_line(plan) if plan.queues else _poll(plan))
        if not _learnt_late(plan, outcome):
            return outcome


def _flags(plan: AcquirePlan) -> str:
    """take.lua's and join.lua's flags for ``plan``: fencing, and which result answers it."""
    wanted = ("j" if plan.job else "d") if plan.want_result else ""
    unfair = "u" if plan.unfair else ""
    return ("f" if plan.fencing else "") + wanted + ("x" if plan.only_takeover else "") + unfair


@dataclass(slots=True)
class Waiting:
    """take.lua found the lock held, and we may wait in line for it."""


def _poll(plan: AcquirePlan) -> Flow:
    """take.lua: try; with a queue, join it when the lock is held; without (quorum mode), look
    again after a short random delay until the wait is over."""
    keys, clock = plan.keys, plan.clock
    deadline = plan.started + plan.max_wait
    taking, args = keys.take_call(plan, _flags(plan))
    # A lease taken by a try whose reply never came goes back (not held by nobody for a whole
    # lease), unless it took a job's reservation over: the key must stay the job's.
    silent = None if plan.takeover else give_back(keys, plan.token)
    holder: Any = None
    contended = False
    while True:
        sent_at = clock()
        reply = yield Eval(
            keys.TAKE,
            taking,
            args,
            reply_timeout=reply_budget(deadline - sent_at),
            give_back=silent,
        )
        if int(reply[0]) == 1:
            return Acquired(
                int(reply[1]), int(reply[2]), sent_at, "", other_limit=other_limit(reply)
            )
        if int(reply[0]) == 2:
            return Done(reply[1])
        pttl = int(reply[1])
        holder = holder or reply[2] or None  # (none: the x flag, and nothing to take over)
        remaining = deadline - clock()
        if remaining <= 0:
            return NotAcquired(holder, pttl)
        if plan.queues:
            return Waiting()
        if not contended:
            contended = True
            plan.on_contended(plan, holder)
        yield Sleep(min(remaining, random.uniform(*RETRY_DELAY)))


def _wait_in_line(plan: AcquirePlan) -> Flow:
    """join.lua, and while it queues us, a block on our wake-up list, sent together (one round
    trip) where the backend can; until the wait is over, or a release hands us the lease."""
    keys, token, clock = plan.keys, plan.token, plan.clock
    deadline = plan.started + plan.max_wait
    holder: Any = None
    pttl = 0
    # How long the holder's lease has left: ours, until a join tells us.
    hint = plan.lease_ms / 1000
    # When the first live waiter ahead of us will be counted dead (a join tells us): the lease
    # may be handed to it, and then ends with its liveness, so we look again by then.
    ahead_until = math.inf
    queued = contended = False
    liveness = LIVENESS_SLACK
    # Until when (our clock) the queue counts us alive, by our latest join that queued us.
    alive_until = -math.inf
    # fair=False: woken to compete for a free lock (an empty message). The next try is a
    # RETRY: it takes the lock if it is free, else leaves our place as it is, and we block
    # again, while the queue counts us alive long enough; cheaper for the server than a join,
    # and on a busy unfair lock most wake-ups lose the race to the releaser coming back.
    woken_to_compete = False

    def queued_now(reply: Any) -> float:
        """A join sent with its block has answered (the block goes on): when it queued us,
        say so now, not when the block ends, and tell how long the block may last."""
        nonlocal contended
        if int(reply[0]) == 0:
            if not contended:
                contended = True
                plan.on_contended(plan, reply[2] or None)
            if plan.on_holder is not None and reply[2]:
                plan.on_holder(plan, reply[2])
        return until_it_matters(reply)

    try:
        while True:
            sent_at = clock()
            remaining = deadline - sent_at
            mode = QUEUE if remaining > 0 else TAKE_OR_LEAVE
            if (
                woken_to_compete
                and mode == QUEUE
                and not plan.replicas
                and alive_until - LIVENESS_SLACK - sent_at > MIN_BLOCK
            ):
                mode = RETRY
            woken_to_compete = False
            flags = _flags(plan)
            if (
                mode not in (QUEUE, RETRY)
                or plan.on_holder is not None
                or (not contended and plan.report_holder())
            ):
                flags += "o"
            # Wake at the latest when the wait ends, or when the holder's lease does (it may
            # have died without releasing): then the time must be kept exactly. And by the
            # time the waiter ahead of us is counted dead, give or take the server's timer.
            loose = min(ahead_until - sent_at, BLOCK_CAP)
            if mode == RETRY:  # (blocked no longer than the queue counts us alive, less a slack;
                # and should we lose the race, we ask again on our own by LOST_RACE_RETRY_MS:
                # releases meanwhile leave the lock free without waking us, see join.lua)
                loose = min(
                    loose, alive_until - LIVENESS_SLACK - sent_at, LOST_RACE_RETRY_MS / 1000
                )
            block, exact = _block(min(remaining, hint), loose)
            together = mode in (QUEUE, RETRY) and not plan.replicas
            if together:
                flags += "b"
            if mode == RETRY:
                liveness = alive_until - sent_at  # (if our entry is gone, a join with it)
            else:
                liveness = (block if mode == QUEUE else 0.0) + LIVENESS_SLACK
                alive_until = sent_at + liveness
            join_keys, args = keys.join_call(plan, mode, flags, int(liveness * 1000))
            join = Eval(
                keys.JOIN, join_keys, args,
                reply_timeout=reply_budget(remaining), give_back=give_back(keys, token),
            )  # fmt: skip
            message = None
            try:
                queued = True  # perhaps, from here on: an error leaves the line
                if together:
                    reply, message = yield Block(
                        keys.wake(token), block, exact, first=join, after_first=queued_now
                    )
                else:
                    reply = yield confirmed(plan, join)
            except Exception as error:
                if not plan.retry_soon(error):
                    raise
                # The lock's keys are being moved (Redis Cluster): look again shortly, and
                # when the wait is over, it was held (or we would not be in this loop).
                if deadline - clock() <= 0:
                    queued = False  # our liveness deadline passes: the queue skips us
                    return NotAcquired(holder, pttl)
                yield Sleep(min(deadline - clock(), random.uniform(*RETRY_DELAY)))
                continue
            if plan.replicas:
                reply = yield from check_replicas(plan, reply)
            code = int(reply[0])
            if code == 1:  # (a message popped with it is join.lua's own, ending the block)
                queued = False
                granted = Acquired(
                    int(reply[1]), int(reply[2]), sent_at, "", other_limit=other_limit(reply)
                )
                if reply[3]:
                    granted = from_message(reply[3], sent_at)[0]
                    if granted.done:
                        return (yield from _result_instead(plan, granted))
                return granted
            if code == 2:
                queued = False
                return Done(reply[1])
            # (0 when a live waiter is ahead of us: the join did not read the holder's lease,
            # which that waiter takes over should it end; we look again by its deadline.)
            pttl = int(reply[1])
            hint = pttl / 1000 + 0.001 if pttl > 0 else BLOCK_CAP
            joined = joined_us(reply)
            ahead = ahead_ms(reply)
            if mode != RETRY or ahead > 0:  # (a RETRY that kept our place says nothing of it)
                ahead_until = sent_at + ahead / 1000 + 0.001 if ahead > 0 else math.inf
            holder = holder or reply[2] or None
            if not together and plan.on_holder is not None and reply[2]:
                plan.on_holder(plan, reply[2])  # (together: queued_now told it already)
            if mode not in (QUEUE, RETRY):
                queued = False
                return NotAcquired(holder, pttl)
            queued = True
            if not contended:
                contended = True
                plan.on_contended(plan, holder)
            if not together:
                remaining = deadline - clock()
                if remaining <= 0:
                    continue
                # (No longer than the liveness the join gave us: the queue counts us alive.)
                block, exact = _block(
                    min(remaining, hint), min(ahead_until - clock(), liveness - LIVENESS_SLACK)
                )
                message = yield Block(keys.wake(token), block, exact)
            if message:  # a release handed us the lease
                granted, handed = from_message(message, sent_at)
                if handed and handed <= joined:
                    # Handed before this join, which would have found the lease ours, had it
                    # still been: a late push of a lease that ended meanwhile. Not a grant.
                    continue
                queued = False
                # It was handed after our join ran (else the join would have found it ours),
                # until our liveness deadline at the latest: it runs at least that long from
                # when we sent the join, whatever the message says of the time it was handed.
                granted.lease_ms = max(
                    granted.lease_ms,
                    min(plan.lease_ms, HANDOFF_MS, int((alive_until - sent_at) * 1000)),
                )
                if granted.done:
                    return (yield from _result_instead(plan, granted))
                if plan.replicas:
                    yield from confirm_handoff(plan, granted.next_token)
                    granted = Acquired(granted.fence, plan.lease_ms, clock(), granted.next_token,
                                       granted.done)  # fmt: skip
                return granted
            # (None: the block ran out; empty: fair=False, the lock was left free for us.)
            woken_to_compete = plan.unfair and message is not None
    except GeneratorExit:
        if queued:  # closed by its owner: nothing more may be sent
            plan.strayed(plan, token, alive_until)
        raise
    except BaseException as error:
        if queued and (plan.unreachable(error) or not (yield from _leave(plan))):
            # Counted alive for the rest of its liveness, unless this process steps it out
            # at its next acquisition of this lock (``strays``).
            plan.strayed(plan, token, alive_until)
        raise


def _block(tight: float, loose: float) -> tuple[float, bool]:
    """How long to block, and whether exactly: ``tight`` is when the time matters to the
    millisecond (the wait's end, the holder's lease end), ``loose`` when the server's timer will
    do (the block cap, the waiter ahead counted dead)."""
    return max(MIN_BLOCK, min(tight, loose)), tight < loose


def _result_instead(plan: AcquirePlan, granted: Acquired) -> Flow:
    """Handed the lock after the guarded work was done (``want_result``): pass it on, and
    answer with the work's result."""
    keys = plan.keys
    assert isinstance(keys, LockKeys)  # (only a lock's work leaves a result)
    # Passed on before the result is read: a caller interrupted or cancelled while it reads
    # leaves nothing held (the release is a clean-up step, carried to its end; a release
    # never touches the result).
    yield from release(keys, plan.token, granted.next_token, cleanup=True)
    result = yield Command(("GET", keys.result_of(plan.token)))
    if result is None:  # expired meanwhile: nothing to answer with but "not acquired"
        return NotAcquired(None, 0)
    return Done(result)


def _leave(plan: AcquirePlan) -> Flow:
    """Step out of the line, interrupted; a lease handed to us meanwhile is passed on. Returns
    False when Redis could not be told (our liveness deadline passes, and the queue skips us)."""
    keys = plan.keys
    try:
        leave_keys, args = keys.join_call(plan, LEAVE, "", 1000)
        # Its reply unread (interrupted again, its time up), a lease it found ours goes back
        # behind it all the same: a hand-off to a waiter that went, held by nobody otherwise.
        reply = yield Eval(
            keys.JOIN, leave_keys, args, cleanup=True, give_back=give_back(keys, plan.token)
        )
        if int(reply[0]) == 1:
            yield from release(keys, plan.token, "", cleanup=True)
    except Exception:
        return False
    return True
