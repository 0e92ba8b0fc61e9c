"""The deterministic simulation: many clients' flows on one real redis-server, one request at a
time, in the order the schedule's decisions (``choices.py``) say, with faults as scheduled
events, and the invariants (``ledger.py``) checked after every step.

One step is one of:

- a ready client's request goes to Redis (``Eval``, ``Command``, ``Pipeline``; a ``Block``'s
  script first, after which it parks), and its reply goes back into its flow; or, as a fault,
  the request is lost before Redis ran it, or its reply after, or it timed out (the
  ``give_back`` the flow attached is then sent after it, as the real backend does);
- a parked client wakes: what arrived on its wake-up list (popped right after the step that
  pushed it, as Redis serves a blocked ``BLPOP``), or nothing when its time is up;
- time moves, when every client waits for it, to the first moment one wakes by itself; leases
  and other keys run out on the way (``server.py``);
- a fault: a client crashes (it never runs again; a watch of its machine may then end its
  lease, ``takeover.py``), pauses (time passes it by: a GC pause, a
  stopped VM, a renewal late), stalls between its release and the wake-up it must push (the
  window of one round trip), loses the wake-up that was popped for it (its connection died
  with the reply), or is stalled while time passes (a slow network); Redis restarts, with no
  data, or from a snapshot taken earlier in the schedule (every parked client's connection dies,
  and the scripts must be loaded again); or a fault of the topology's (``topology.py``).

Time never passes while a client is ready unless a fault says so: without faults, a request
takes no time, and a waiter always asks again before its liveness deadline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from django_redis_lock.core.requests import Block, Command, Eval, Failover, Pipeline, Request
from django_redis_lock.core.uncontended import WAKE

from .choices import Choices
from .clients import NOTHING, Client
from .ledger import Ledger, Violation
from .server import Observed, scaled, unscaled_pttl
from .takeover import watch
from .trace import Trace, describe
from .world import Snapshot, Stalled, World, aged, taken

__all__ = ["FAULTS_ON", "NO_FAULTS", "START_US", "Faults", "Simulation", "SimulationFailed"]

# Simulated time starts here (µs since the epoch): the scripts' clock reads like a real one.
START_US = 1_800_000_000_000_000


@dataclass(frozen=True)
class Faults:
    """How often faults happen: ``percent`` of the steps are a fault event (crash, pause, lost
    wake-up, stall, restart), and ``request_percent`` of the requests are lost or time out."""

    percent: int = 0
    request_percent: int = 0
    restarts: bool = True

    @property
    def on(self) -> bool:
        return bool(self.percent or self.request_percent)


NO_FAULTS = Faults()
FAULTS_ON = Faults(percent=6, request_percent=6)


def _pushes_a_wake_up(request: Any) -> bool:
    """A release's push of a wake-up message (``core/release.py``), sent a round trip after."""
    return type(request) is Eval and request.script == WAKE


class SimulationFailed(AssertionError):
    """An invariant broke (or the schedule never ended); the message has the trace."""

    def __init__(self, violation: Violation, trace: str) -> None:
        super().__init__(f"{violation}\n\n{trace}")
        self.violation = violation


@dataclass
class Simulation:
    world: World
    choices: Choices
    faults: Faults = NO_FAULTS
    max_steps: int = 3000  # a schedule longer than this never ends: a violation
    fault_steps: int = 120  # faults only happen in the first steps; then everyone finishes
    ledger: Ledger = field(default_factory=Ledger)
    clients: list[Client] = field(default_factory=list)
    now_us: int = START_US
    steps: int = 0
    trace: Trace = field(default_factory=lambda: Trace(START_US))
    _ttl_ms: int = 0  # the simulated ms the keys' TTLs were last given at
    _snapshot: Snapshot | None = None

    def __post_init__(self) -> None:
        self.backend = self.world.backend
        self.ledger.now_us = self.now_us

    def add(self, name: str, start: Callable[[Client], Any], arrival_ms: int = 0) -> Client:
        client = Client(name, start, self.now_us + arrival_ms * 1000)
        self.clients.append(client)
        return client

    def clock(self) -> float:
        """The clients' monotonic clock: simulated seconds, in whole ms. (The scripts' clock
        moves by a µs at every step, so that each sees its own time; a client's clock does
        not, so that a lease it counts from a request it sent ends no later than Redis's copy,
        whose expiry is in whole ms.)"""
        return self.now_us // 1000 / 1000

    # -- running -------------------------------------------------------------------------------

    def run(self) -> None:
        """Run every client to its end; raises :class:`SimulationFailed`."""
        self.world.reset(self.now_us)
        self._ttl_ms = self.now_us // 1000
        expired = self.world.expirations()
        try:
            self._observe()
            while not all(client.finished for client in self.clients):
                if self.steps >= self.max_steps:
                    left = ", ".join(f"{c.name} {c.state}" for c in self.clients if not c.finished)
                    raise Violation(self.steps, f"the schedule never ended: {left}")
                self.steps += 1
                self.ledger.step = self.steps
                self._step()
        except Violation as violation:
            if self.world.expirations() > expired:
                raise Stalled(
                    f"{violation} (after a key expired by a server's own clock)"
                ) from None
            raise SimulationFailed(violation, self.trace.text()) from None
        finally:
            for client in self.clients:
                if client.program is not None:
                    client.program.close()

    def _step(self) -> None:
        faulty = self.faults.on and self.steps <= self.fault_steps
        runnable = [client for client in self.clients if client.runnable(self.now_us)]
        if faulty and self.choices.chance(self.faults.percent) and self._fault(runnable):
            return
        pushing = [c for c in runnable if _pushes_a_wake_up(c.request)]
        if faulty and pushing and self.choices.chance(15):  # (the window of one round trip)
            self._delay_push(self.choices.pick(pushing))
            return
        under_way = self.world.under_way()
        if under_way is not None and self.choices.chance(25):  # (a slot moves key by key)
            self._world_fault(under_way)
            return
        if not runnable:
            self._advance()
            return
        client = self.choices.pick(runnable)
        if client.state == "parked":
            self._wake(client)
        elif client.state == "sleeping":
            client.resume(self.now_us)
        else:
            self._send(client, faulty)

    def _advance(self, to_us: int | None = None) -> None:
        """Move time to when the first client wakes by itself (or ``to_us``)."""
        times = [t for t in (c.waiting_until() for c in self.clients if not c.finished) if t]
        if to_us is None:
            if not times:
                raise Violation(self.steps, "nobody can move: " + ", ".join(
                    f"{c.name} {c.state}" for c in self.clients if not c.finished))  # fmt: skip
            to_us = min(times)
        if to_us > self.now_us:
            self.trace.add(self.now_us, "", f"time +{(to_us - self.now_us) / 1000:.3f} ms")
            self.now_us = to_us
            self._observe()

    def _send(self, client: Client, faulty: bool) -> None:
        request = client.request
        assert request is not None
        fault = None
        if (
            faulty
            and type(request) is not Failover
            and self.choices.chance(self.faults.request_percent)
        ):
            fault = self.choices.pick(("lost before", "lost after", "timed out"))
            self.ledger.faults += 1
        if type(request) is Block:
            first = request.first
            if first is None:
                self._park(client, request, request.seconds, NOTHING)
                return
            reply, error = self._carry(client, first, fault)
            if error is not None:
                client.resume(self.now_us, error=error)
                return
            seconds = request.seconds
            if request.after_first is not None:
                seconds = min(seconds, max(request.after_first(reply), 0.001))
            self._park(client, request, seconds, reply)
            return
        reply, error = self._carry(client, request, fault)
        client.resume(self.now_us, reply, error)

    def _carry(self, client: Client, request: Request, fault: str | None) -> tuple[Any, Any]:
        """Send ``request`` to Redis (unless lost before); the reply or the error to give back."""
        if fault == "lost before":
            self.trace.add(self.now_us, client.name, describe(request), "LOST before Redis")
            return None, RedisConnectionError("simulated: the request was lost")
        try:
            reply = self._perform(request)
        except Exception as error:  # (a reply that is an error goes back in)
            reply, error_reply = None, error
        else:
            error_reply = None
        if fault == "timed out" and getattr(request, "give_back", None) is not None:
            with contextlib.suppress(Exception):  # sent after it, its reply never read
                self._perform(request.give_back)  # type: ignore[union-attr]
        self.now_us += 1
        self._observe()
        if fault is not None:
            self.trace.add(self.now_us, client.name, describe(request), f"ran, reply {fault}")
            if fault == "timed out":
                return None, RedisTimeoutError("simulated: no reply in time")
            return None, RedisConnectionError("simulated: the reply was lost")
        self.trace.add(self.now_us, client.name, describe(request), describe(error_reply or reply))
        return reply, error_reply

    def _perform(self, request: Request) -> Any:
        with self.world.carrying():
            return self._carried(request)

    def _carried(self, request: Request) -> Any:
        if type(request) is Eval:
            script = self.world.scripts[request.script]
            return self.backend.run_script(script, request.keys, request.args)
        if type(request) is Command:
            return self._replied(request.args, self.backend.send(*scaled(request.args)))
        if type(request) is Pipeline:
            replies = self.backend.send_many([scaled(command) for command in request.commands])
            return [self._replied(c, r) for c, r in zip(request.commands, replies, strict=True)]
        if type(request) is Failover:
            return None
        raise TypeError(f"the simulation cannot carry out {request!r}")

    @staticmethod
    def _replied(command: tuple[Any, ...], reply: Any) -> Any:
        return unscaled_pttl(reply) if str(command[0]).upper() == "PTTL" else reply

    def _park(self, client: Client, request: Block, seconds: float, first_reply: Any) -> None:
        # (A request that waited for a stall counts its block from when it was sent.)
        deadline = None if client.paused_while_acquiring else client.deadline_us
        self.ledger.blocked(client.name, seconds, deadline)
        client.park(request, seconds, self.now_us, first_reply)
        self.trace.add(self.now_us, client.name, f"blocks on its wake-up list, {seconds:.3f} s")
        self._observe()  # (pops what is there already)

    def _wake(self, client: Client) -> None:
        if client.broken is not None:
            error, client.broken = client.broken, None
            self.trace.add(self.now_us, client.name, "block fails", repr(error))
            client.resume(self.now_us, error=error)
            return
        self.trace.add(
            self.now_us, client.name, "wakes", repr(client.inbox[0] if client.inbox else None)
        )
        client.resume(self.now_us, client.wake_up())

    def _observe(self) -> Observed:
        waiting = [c for c in self.clients if c.state == "parked" and not c.inbox and not c.broken]
        moved = self.now_us // 1000 - self._ttl_ms
        self._ttl_ms = self.now_us // 1000
        observed = self.world.observe(self.now_us, moved, [c.wake_key for c in waiting])
        for client, popped in zip(waiting, observed.popped, strict=True):
            if popped is not None:
                client.inbox.append(popped)
        if observed.expired:
            self.trace.add(self.now_us, "", "expired: " + ", ".join(observed.expired))
        self.ledger.now_us = self.now_us
        self.ledger.observed(observed)
        return observed

    # -- faults --------------------------------------------------------------------------------

    def _fault(self, runnable: list[Client]) -> bool:
        """One fault event, if one can happen now; False when none could."""
        alive = [c for c in self.clients if not c.finished]
        kinds = ["crash", "pause", "snapshot"]
        if runnable:
            kinds.append("stall")
        if any(c.state == "parked" and c.inbox for c in alive):
            kinds.append("lose wake-up")

        if self.faults.restarts and self.world.restartable():
            kinds.append("restart")
        kinds += self.world.faults
        kind = self.choices.pick(kinds)
        self.ledger.faults += 1
        if kind == "crash" and alive:
            client = self.choices.pick(alive)
            client.crash()
            self.trace.add(self.now_us, client.name, "CRASHES")
            if self.world.backend.queues and self.choices.chance(50):
                # A process of its machine saw it hold a lock: it ends that lease, later.
                arrival = self.choices.pick((0, 5, 400, 2500))
                self.add(f"w{len(self.clients) + 1}", watch(self.ledger, client), arrival)
        elif kind == "pause" and alive:
            client = self.choices.pick(alive)
            ms = self.choices.pick((50, 500, 1500, 3000, 6000))
            client.paused_until_us = self.now_us + ms * 1000
            client.paused_while_acquiring |= client.deadline_us is not None
            self.trace.add(self.now_us, client.name, f"PAUSES for {ms} ms")
        elif kind == "stall":
            for client in alive:  # time passes them all by, the ready ones without a reply
                client.paused_while_acquiring |= client.deadline_us is not None
            ms = self.choices.pick((1, 20, 300, 1500))
            self.trace.add(self.now_us, "", f"STALL: the ready ones wait {ms} ms")
            for client in runnable:
                client.paused_until_us = self.now_us + ms * 1000
            self._advance(self.now_us + ms * 1000)
        elif kind == "lose wake-up":
            client = self.choices.pick([c for c in alive if c.state == "parked" and c.inbox])
            self.trace.add(self.now_us, client.name, f"LOSES its wake-up {client.inbox[0]!r}")
            client.inbox = []
            client.broken = RedisConnectionError("simulated: the wake-up's reply was lost")
        elif kind == "snapshot":
            self._snapshot = taken(self.world, self.ledger.state, self.now_us)
            self.trace.add(self.now_us, "", "snapshot")
        elif kind == "restart":
            self._restart()
        elif kind in self.world.faults:
            self._world_fault(kind)
        else:
            return False
        return True

    def _delay_push(self, client: Client) -> None:
        """A wake-up push delayed: its sender stalls between its release and the push."""
        self.ledger.faults += 1
        ms = self.choices.pick((1500, 300, 3000))
        client.paused_until_us = self.now_us + ms * 1000
        client.paused_while_acquiring |= client.deadline_us is not None  # (a leave's release)
        self.trace.add(self.now_us, client.name, f"DELAYS its wake-up push by {ms} ms")

    def _world_fault(self, kind: str) -> None:
        self.ledger.faults += 1
        what, lost_data = self.world.fault(kind, self.choices)
        self.trace.add(self.now_us, "", what.upper())
        if lost_data:
            self._connections_died()
            self.ledger.data_lost()
        self.now_us += 1
        self._observe()

    def _connections_died(self) -> None:
        for client in self.clients:
            if client.state == "parked":
                client.inbox = []
                client.broken = RedisConnectionError("simulated: Redis restarted")

    def _restart(self) -> None:
        restored: dict[str, tuple[bytes, int]] | None = None
        with_data = self._snapshot is not None and self.choices.chance(50)
        if with_data:
            assert self._snapshot is not None
            restored = aged(self._snapshot, self.now_us)
        self.world.restart(restored)
        self.trace.add(
            self.now_us, "", f"RESTART of Redis, {'from the snapshot' if with_data else 'empty'}"
        )
        self._connections_died()
        self.ledger.data_lost()
        self.now_us += 1
        self._observe()
