"""Ending and lengthening a hold, as flows (see ``flows.py``): ``release`` hands the lease to
the first live waiter (``release.lua``) and wakes it; ``extend`` lengthens it."""

from __future__ import annotations

import contextlib

from .layout import KeyLayout
from .lease import PENDING_JOB, LockKeys, is_reservation, job_of, reservation_token
from .requests import Command, Eval, Failover, Flow
from .uncontended import release_request, released, text

__all__ = [
    "Unconfirmed",
    "WaitRefused",
    "end_reservation",
    "extend",
    "give_back",
    "release",
    "release_telling_first",
    "text",
]


class WaitRefused(int):
    """No replica confirmed a write because the server refused ``WAIT`` (an ACL without it, a
    managed service that disables it): the count of a confirmation, 0, which carries why.

    An ``int``, so that every step that compares the count with ``MIN_REPLICAS`` gives the
    write back as it would for a confirmation that did not come."""

    reason: str

    def __new__(cls, reason: str) -> WaitRefused:
        refused = super().__new__(cls, 0)
        refused.reason = reason
        return refused


class Unconfirmed(Exception):
    """Too few replicas confirmed a write within the time allowed (``MIN_REPLICAS``).
    ``acknowledged`` is a :class:`WaitRefused` when the server refused to count them."""

    def __init__(self, acknowledged: int, replicas: int) -> None:
        super().__init__(f"{acknowledged} of {replicas} replicas confirmed")
        self.acknowledged = acknowledged
        self.replicas = replicas


def give_back(keys: KeyLayout, token: str) -> Eval:
    """Sent after an acquisition request whose reply we gave up on (too slow, cancelled), on
    the same connection: the lease that request may have granted goes back instead of being
    held for a lease by nobody."""
    return Eval(keys.RELEASE, keys.release_keys("", token), (token, ""))


def release(
    keys: KeyLayout,
    token: str,
    expected: str,
    *,
    result: bytes | None = None,
    result_ttl_ms: int = 0,
    unfair_ms: int = 0,
    reply_timeout: float | None = None,
    cleanup: bool = False,
) -> Flow:
    """Release the lease ``token`` holds, handing it to the first live waiter (``expected``:
    the one we think is first). ``result``: kept ``result_ttl_ms`` for duplicates;
    ``unfair_ms``: see ``uncontended.release_request``. Returns
    0 (released), -1 (not ours: nothing touched) or -2 (the key is not a lock)."""
    code, _ = yield from release_telling_first(
        keys, token, expected, result=result, result_ttl_ms=result_ttl_ms,
        unfair_ms=unfair_ms, reply_timeout=reply_timeout, cleanup=cleanup,
    )  # fmt: skip
    return code


def release_telling_first(
    keys: KeyLayout,
    token: str,
    expected: str,
    *,
    result: bytes | None = None,
    result_ttl_ms: int = 0,
    unfair_ms: int = 0,
    reply_timeout: float | None = None,
    cleanup: bool = False,
) -> Flow:
    """:func:`release`, returning its code and the first waiter it handed the lease to or woke
    ('': none), whom a ``fair=False`` lock's next release expects (as ``drivers.release``
    does for the primitives)."""
    keep = (result, result_ttl_ms) if result is not None else ()
    reply = yield release_request(
        keys, token, expected, keep, unfair_ms=unfair_ms, reply_timeout=reply_timeout,
        cleanup=cleanup,
    )  # fmt: skip
    code, wake, first = released(keys, reply)
    if wake is not None:
        with contextlib.suppress(Exception):
            yield wake
    return code, first


def extend(
    keys: KeyLayout, token: str, lease_ms: int, replicas: int = 0, timeout_ms: int = 0
) -> Flow:
    """Make the lease end ``lease_ms`` from now; False when it is no longer ours."""
    reply = yield Eval(
        keys.EXTEND,
        keys.extend_keys(),
        (token, lease_ms),
        replicas=replicas,
        replica_timeout_ms=timeout_ms,
    )
    if replicas:
        reply, acknowledged = reply
        if int(reply) == 1 and acknowledged < replicas:
            yield Failover(keys.lease)
            raise Unconfirmed(acknowledged, replicas)
    return int(reply) == 1


def end_reservation(keys: LockKeys, job_id: str) -> Flow:
    """End ``job_id``'s reservation, or a pending one (queued before its job's id was known,
    and not yet renamed: it is this job's, whose run starts now). Returns as :func:`release`.
    One round trip; two more when the reservation is not ``job_id``'s own."""
    code = yield from release(keys, reservation_token(job_id), "")
    if code != -1:
        return code
    value = yield Command(("GET", keys.lease))
    token = text(value).split("|", 1)[0] if value is not None else ""
    if not (is_reservation(token) and (job_of(token) or "").startswith(PENDING_JOB)):
        return -1
    return (yield from release(keys, token, ""))
