"""Grants under ``DJANGO_REDIS_LOCK_MIN_REPLICAS``: a lease counts as granted only once enough
replicas confirmed the write (``WAIT``), so that a failover to a replica cannot lose it. Steps
of the acquisition flow (``flows.py``); each gives the lease back and raises
:class:`Unconfirmed` when too few replicas confirmed it."""

from __future__ import annotations

from typing import Any

from .plan import AcquirePlan
from .release import Unconfirmed, release
from .requests import Eval, Failover, Flow

__all__ = ["check_replicas", "confirm_handoff", "confirmed"]


def confirmed(plan: AcquirePlan, request: Eval) -> Eval:
    """``request`` (a grant), to be confirmed by ``plan.replicas`` replicas when it grants."""
    if not plan.replicas:
        return request
    return Eval(
        request.script, request.keys, request.args,
        replicas=plan.replicas, replica_timeout_ms=plan.replica_timeout_ms,
    )  # fmt: skip


def check_replicas(plan: AcquirePlan, reply: Any) -> Flow:
    """For a grant under ``MIN_REPLICAS``: give it back, and raise, unless enough replicas
    confirmed it. Returns the script's own reply."""
    reply, acknowledged = reply
    if int(reply[0]) == 1 and acknowledged < plan.replicas:
        yield from release(plan.keys, plan.token, "", cleanup=True)
        yield Failover(plan.keys.lease)
        raise Unconfirmed(acknowledged, plan.replicas)
    return reply


def confirm_handoff(plan: AcquirePlan, next_token: str) -> Flow:
    """A lease handed to us is the releaser's write, which our ``WAIT`` cannot count: lengthen
    it ourselves, a write of ours, and have that confirmed (``next_token``: who is next, to
    pass the lease on to if not)."""
    keys = plan.keys
    reply, acknowledged = yield Eval(
        keys.EXTEND, keys.extend_keys(), (plan.token, plan.lease_ms),
        replicas=plan.replicas, replica_timeout_ms=plan.replica_timeout_ms,
    )  # fmt: skip
    if int(reply) == 1 and acknowledged < plan.replicas:
        yield from release(keys, plan.token, next_token, cleanup=True)
        yield Failover(keys.lease)
        raise Unconfirmed(acknowledged, plan.replicas)
