"""Budgets for the responses ``@prevent_double_submit`` keeps, so that no client fills Redis.

A finished submission's response is kept in Redis for its duplicates (``hold`` seconds, or
``idempotency_ttl`` for an ``Idempotency-Key``). Before a response body is kept, its size is
charged against two budgets: the client's (``DJANGO_REDIS_LOCK_REPLAY_CLIENT_MAX_BYTES``) and
everyone's (``DJANGO_REDIS_LOCK_REPLAY_TOTAL_MAX_BYTES``). A body that does not fit is not
kept: its duplicates get 409 instead of the replay, and are still never run twice.

Each budget is a fixed window as long as the time the responses are kept (one window per keep
time), so the bodies kept for one keep time never exceed twice the budget: those of the window
now and of the one before, which are still running out. Why it matters beyond memory: with
``maxmemory-policy noeviction`` (what locks need, see docs/deployment.md) a full Redis refuses
new leases, so unbounded replays could stop every lock.
"""

from __future__ import annotations

import hashlib
import logging

from redis.exceptions import RedisError

from ..backends import backend_of
from ..backends.clients import LockAlias
from ..backends.scripts import load_script
from ..conf import lock_settings
from ..primitives.keys import replay_budget_key

__all__ = ["charge"]

logger = logging.getLogger("django_redis_lock")

CHARGE = load_script("charge_replay")

_REFUSALS = {
    0: "the client's budget (DJANGO_REDIS_LOCK_REPLAY_CLIENT_MAX_BYTES) is spent",
    -1: "the total budget (DJANGO_REDIS_LOCK_REPLAY_TOTAL_MAX_BYTES) is spent",
}


def charge(alias: LockAlias, client: str, size: int, window_ms: int) -> str | None:
    """Count ``size`` bytes kept for ``client`` (its identity: hashed here) for ``window_ms``.
    Returns None when they fit, else why not (then they must not be kept)."""
    client_limit = lock_settings.REPLAY_CLIENT_MAX_BYTES
    total_limit = lock_settings.REPLAY_TOTAL_MAX_BYTES
    if size > min(client_limit, total_limit):
        budget = "client's" if client_limit <= total_limit else "total"
        return f"it is larger than the whole {budget} budget ({min(client_limit, total_limit)} B)"
    field = hashlib.sha256(client.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    # A quorum's servers each keep the responses: the first that answers keeps the count.
    args = [field, size, client_limit, total_limit, window_ms]
    for copy in backend_of(alias).copies():
        try:
            answer = int(copy.run_script(CHARGE, [replay_budget_key(alias, window_ms)], args))
        except RedisError as exc:
            logger.debug("Could not count a kept response against its budget: %s", exc)
            continue
        return _REFUSALS.get(answer)
    return "Redis could not be reached to count it against its budget"
