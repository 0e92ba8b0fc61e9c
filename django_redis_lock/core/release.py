"""Ending and lengthening a hold, as flows (see ``flows.py``): ``release`` hands the lease to
the first live waiter (``release.lua``) and wakes it; ``extend`` lengthens it."""

from __future__ import annotations

import contextlib
from typing import Any

from .lease import LockKeys
from .requests import Eval, Failover, Flow, Pipeline

__all__ = ["Unconfirmed", "extend", "give_back", "release", "text"]


class Unconfirmed(Exception):
    """Too few replicas confirmed a write within the time allowed (``MIN_REPLICAS``)."""

    def __init__(self, acknowledged: int, replicas: int) -> None:
        super().__init__(f"{acknowledged} of {replicas} replicas confirmed")
        self.acknowledged = acknowledged
        self.replicas = replicas


def text(value: Any) -> str:
    """A reply as ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def give_back(keys: LockKeys, token: str) -> Eval:
    """Sent after an acquisition request whose reply we gave up on (too slow, cancelled), on
    the same connection: the lease that request may have granted goes back instead of being
    held for a lease by nobody."""
    return Eval("release", keys.release_keys(""), (token, ""))


def release(
    keys: LockKeys,
    token: str,
    expected: str,
    *,
    result: bytes | None = None,
    result_ttl_ms: int = 0,
    reply_timeout: float | None = None,
    cleanup: bool = False,
) -> Flow:
    """Release the lease ``token`` holds, handing it to the first live waiter (``expected``:
    the one we think is first). ``result``: kept ``result_ttl_ms`` for duplicates. Returns
    0 (released), -1 (not ours: nothing touched) or -2 (the key is not a lock)."""
    keep = (result, result_ttl_ms) if result is not None else ()
    reply = yield Eval(
        "release", keys.release_keys(expected), (token, expected, *keep),
        reply_timeout=reply_timeout, cleanup=cleanup,
    )  # fmt: skip
    code = int(reply[0])
    if code == 2:
        # Handed to a waiter we did not expect: wake it. If this fails, it finds the lease its
        # own when its block ends and it looks again.
        head, message = text(reply[1]), text(reply[2])
        ms = int(message.split("|", 2)[1])
        with contextlib.suppress(Exception):
            yield Pipeline(
                (("RPUSH", keys.wake(head), message), ("PEXPIRE", keys.wake(head), ms)),
                cleanup=True,
            )
    return 0 if code > 0 else code


def extend(
    keys: LockKeys, token: str, lease_ms: int, replicas: int = 0, timeout_ms: int = 0
) -> Flow:
    """Make the lease end ``lease_ms`` from now; False when it is no longer ours."""
    reply = yield Eval(
        "extend",
        (keys.lease,),
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
