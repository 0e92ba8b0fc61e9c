"""The simulation of the library's own code (see ``simulation.py``): our public API under the
scheduler, in simulated processes and threads, over a simulated network, on simulated time,
against the real servers of a world (``../world.py``), checked by the ledger (``../ledger.py``)
and for liveness (``liveness.py``).

It takes over the process it runs in (its clock, its threads: ``threads.py``), so it runs in
processes of its own: ``make simulate`` and the suite's share
(``tests/locks/test_runtime_simulation.py``) start them.
"""

from __future__ import annotations

import contextlib
import gc
import random
import threading
import types
from collections.abc import Iterator
from typing import Any

import django
from django.conf import settings
from django.test import override_settings
from django_redis import get_redis_connection

from django_redis_lock.backends import clients
from django_redis_lock.primitives import eviction, owners
from django_redis_lock.primitives.background import dead_holders, process_records

from ..choices import Choices
from ..simulation import NO_FAULTS, Faults
from ..world import World
from . import cluster
from .aio import async_twin
from .connection import SimulatedConnection
from .guarded import cast_guards
from .network import install
from .programs import WORKLOADS as PRIMITIVES_WORKLOADS
from .programs import cast
from .queued import cast_tasks
from .simulation import RuntimeSimulation
from .threads import simulated_runtime

__all__ = ["WORKLOADS", "RuntimeSimulation", "run_runtime_schedule"]

# The primitives' workloads (``programs.py``), the guards' (``guarded.py``) and the task
# guards' (``queued.py``).
WORKLOADS = (*PRIMITIVES_WORKLOADS, "guards", "tasks")

# Django's settings for a process that runs schedules (when none are configured yet).
SETTINGS: dict[str, Any] = {
    "INSTALLED_APPS": ["django_redis_lock"],
    "USE_TZ": True,
    "DJANGO_REDIS_LOCK_KEY_PREFIX": "drl-sim",
    "LOGGING_CONFIG": None,
}


# The cache alias of a quorum's locks (the members' are m1, m2, ...).
QUORUM_ALIAS = "redlock"


def alias_of(world: World) -> str:
    """The cache alias the schedule's locks use (``DJANGO_REDIS_LOCK_CACHE_ALIAS``)."""
    return QUORUM_ALIAS if world.name == "quorum" else "default"


SOCKET_TIMEOUT = 1.0


def _caches(world: World) -> dict[str, Any]:
    """One cache per server of the world, its connections the simulated network's: on one
    server, ``default``; a quorum's members ``m1``, ``m2``... (and ``default``, the first)."""

    def cache(url: str) -> dict[str, Any]:
        return {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": {
                "SOCKET_TIMEOUT": SOCKET_TIMEOUT,
                "SOCKET_CONNECT_TIMEOUT": SOCKET_TIMEOUT,
                "CONNECTION_POOL_KWARGS": {"connection_class": SimulatedConnection},
            },
        }

    caches = {"default": cache(world.home().url)}
    if world.name == "quorum":
        caches.update({f"m{i + 1}": cache(node.url) for i, node in enumerate(world.nodes)})
    return caches


def _lock_settings(world: World) -> dict[str, Any]:
    if world.name == "cluster":  # (the client a user gives for a Cluster: cluster.py)
        return {"DJANGO_REDIS_LOCK_CONNECTION_FACTORY": f"{cluster.__name__}.factory"}
    if world.name != "quorum":
        return {}
    members = [f"m{i + 1}" for i in range(len(world.nodes))]
    return {
        "DJANGO_REDIS_LOCK_QUORUMS": {QUORUM_ALIAS: members},
        "DJANGO_REDIS_LOCK_CACHE_ALIAS": QUORUM_ALIAS,
    }


@contextlib.contextmanager
def _configured(world: World) -> Iterator[None]:
    """Django's settings for one schedule: its caches made anew (so are the library's clients,
    their pools, and the advice it gives once per process and cache: every schedule starts
    from the same place, and replays alone as it ran among others)."""
    if not settings.configured:
        settings.configure(**SETTINGS, CACHES=_caches(world))
        django.setup()
    caches = _caches(world)
    with override_settings(
        CACHES=caches, DJANGO_REDIS_LOCK_KEY_PREFIX="drl-sim", **_lock_settings(world)
    ):
        # Given already: the advice on eviction is read once per process, on a thread of its
        # own (primitives/eviction.py), which would add an INFO to the first schedules only.
        for alias in (*caches, alias_of(world)):
            eviction.advised.claim(alias)
        if world.name == "cluster":
            cluster.prepare(world, SOCKET_TIMEOUT)
        try:
            yield
        finally:
            # django-redis keeps pools by address across caches: this schedule's connections
            # (some taken by threads that crashed, never given back) go with it. In a thread
            # of its own: Django's caches are kept per thread (in its context), and each
            # schedule's, made in this long-lived one, would be kept for good.
            resetting = threading.Thread(target=_reset_pools, args=(list(caches),))
            resetting.start()
            resetting.join()


def _reset_pools(aliases: list[str]) -> None:
    for alias in aliases:
        get_redis_connection(alias).connection_pool.reset()


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


class _SeededBytes:
    """``secrets.token_bytes`` from the schedule's seed: tokens, and so the order of equal
    scores in a sorted set, replay exactly."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed ^ 0x5EED)

    def __call__(self, count: int | None = None) -> bytes:
        return self._random.randbytes(32 if count is None else count)


THAW_EVERY = 200  # schedules
_schedules = [0]


def run_runtime_schedule(
    world: World, workload: str, choices: Choices, faults: Faults = NO_FAULTS, patch: Any = None
) -> RuntimeSimulation:
    """One schedule of ``workload`` on ``world``; raises ``SimulationFailed`` with its trace."""
    seed = getattr(choices, "seed", 0)
    # What the library holds weakly (a hold's Lock object, a task) goes when its last
    # reference does, never at a garbage collection that comes whenever the allocations say:
    # the collector runs between schedules only, so a seed replays alike alone or after others.
    # What is left then is frozen (a collection walks only what the schedules made since: a
    # third of a schedule's time otherwise), and thawed now and then, for what was left alive
    # then and is garbage since.
    _schedules[0] += 1
    if _schedules[0] % THAW_EVERY == 0:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
    gc.disable()
    with _configured(world), contextlib.ExitStack() as stack:
        stack.callback(gc.enable)
        simulation = RuntimeSimulation(world, choices, faults, patch, alias=alias_of(world))
        stack.enter_context(simulated_runtime(simulation.scheduler))
        # The tokens' random bytes (owners.py's only: what else draws from ``secrets`` may
        # differ between a schedule run first and the same run after others).
        seeded = types.SimpleNamespace(token_bytes=_SeededBytes(seed))
        stack.enter_context(_patched(owners, "secrets", seeded))
        install(simulation.network)
        stack.callback(install, None)
        # The watch for dead holders on the simulated host: its processes' pids, start times,
        # pidfds and wake-up pipes (host.py).
        host = simulation.host
        stack.enter_context(_patched(process_records, "started", host.started))
        stack.enter_context(_patched(dead_holders, "os", host.os_module()))
        stack.enter_context(_patched(dead_holders, "selectors", host.selectors_module()))
        # The async clients over the simulated network (twins.twin carries a real
        # connection class over, and refuses any other).
        stack.enter_context(_patched(clients, "twin", async_twin))
        # (A quorum's async client runs each request in a worker thread, and a Cluster's
        # asyncio client has no simulated connection: their async clients are not simulated.)
        asynchronous = world.name == "server"
        if workload == "guards":
            cast_guards(simulation, choices, asynchronous=asynchronous)
        elif workload == "tasks":
            cast_tasks(simulation, choices, asynchronous=asynchronous)
        else:
            cast(simulation, workload, choices)
        simulation.run()
    return simulation
