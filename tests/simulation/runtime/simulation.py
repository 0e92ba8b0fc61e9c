"""A schedule of the library's own code: the clients are our ``Lock``, ``Semaphore`` and
``lock_many``, called as users call them (``programs.py``), in simulated processes
(``processes.py``), on threads run one at a time (``threads.py``), over a network in the
schedule's hands (``network.py``), against the real servers of a world (``../world.py``).

One step is one of:

- a thread runs until it blocks again (it was ready: its reply came, its time is up, it was
  notified, or it is told to stop);
- a command a link carries reaches its server and runs there (links in any order, each in
  its own); the observation that follows pops for the parked ``BLPOP``s, ends those whose time
  is up, and checks the invariants (``../ledger.py``);
- time moves, when nothing else can happen, to when the first thing happens by itself;
- a fault (with faults on, in the first ``fault_steps`` steps; ``faults.py``): a connection
  cut (what it had not delivered lost, and the reply it waits for), its requests held back on
  the way (they arrive, in order, that much later), a reply slowed past its reader's timeout
  (the library then sends its give-back after it), a process crashed (all its threads, its
  connections and its watchdog) or paused, a sync caller interrupted where it blocked
  (``KeyboardInterrupt``; and again as it cleans up), an asyncio client's task cancelled
  where it is suspended (``aio.py``), or the server restarted empty or from a snapshot taken
  earlier (a failover to a replica that missed the writes since).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from django_redis_lock.core.lease import job_of

from ..choices import Choices, SeededChoices
from ..ledger import Ledger, Violation
from ..simulation import NO_FAULTS, START_US, Faults, SimulationFailed
from ..trace import Trace
from ..world import Stalled, World
from .faults import FaultInjection
from .host import SimulatedHost
from .liveness import Liveness
from .network import Network
from .processes import SimulatedProcess
from .threads import Actor, Crashed, Interrupted, Scheduler

__all__ = ["RuntimeSimulation"]

# A schedule longer than this never ends: a violation. (A quorum's client waits on each
# member in turn, half a millisecond at a time: one whose requests are held up 8 s on the way
# costs 16,000 steps.)
MAX_STEPS = 100_000


@dataclass(eq=False)
class RuntimeSimulation:
    world: World
    choices: Choices
    faults: Faults = NO_FAULTS
    patch: Any = None  # a deliberate mutation of the scripts (``../mutations.py``)
    alias: str = "default"  # the cache alias of the schedule's locks
    fault_steps: int = 200
    ledger: Ledger = field(default_factory=Ledger)
    trace: Trace = field(default_factory=lambda: Trace(START_US))
    processes: list[SimulatedProcess] = field(default_factory=list)
    clients: list[Actor] = field(default_factory=list)
    steps: int = 0
    interrupts: int = 0  # (cancellation faults: they must leave nothing held)
    # Faults after which a lease may be left by nobody for a while (a crash, a connection cut,
    # a restart); the others (a slow reply, a pause, an interrupt) must leave nothing.
    disconnections: int = 0
    slow_replies: int = 0
    crashes: int = 0  # (of the faults: liveness.py's dead-holder bound holds after these only)
    # Tokens whose release failed (a LockBackendError: the lease runs out by itself).
    unreleased: set[str] = field(default_factory=set)
    # Jobs a run of which was interrupted, or failed, as it took its key (``queued.py``): what
    # it took is the job's until its lease ends (a run that died; a copy takes over after it).
    unreleased_jobs: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(START_US)
        self.network = Network(self.world, self.scheduler, self.patch)
        self.host = SimulatedHost(self.scheduler, self.processes)
        self.injected = FaultInjection(self)
        self.ledger.now_us = START_US
        self.liveness = Liveness(self)
        self._ttl_ms = START_US // 1000

    def runs_out(self, token: str) -> bool:
        """Whether the lease of ``token`` is documented to be left to run out by itself."""
        job = job_of(token)
        return token in self.unreleased or (job is not None and job in self.unreleased_jobs)

    @property
    def now_us(self) -> int:
        return self.scheduler.now_us

    def clock(self) -> float:
        return self.scheduler.now_us / 1e6

    # -- the cast (programs.py) ------------------------------------------------------------------

    def process(self) -> SimulatedProcess:
        index = len(self.processes)
        process = SimulatedProcess(
            f"p{index + 1}", self.scheduler.monotonic, pid=self.host.pid_for(index),
            started_us=self.now_us,
        )  # fmt: skip
        self.processes.append(process)
        return process

    def add_client(self, name: str, process: SimulatedProcess, program: Any, at_ms: int) -> Actor:
        actor = self.scheduler.add(name, process, program, self.now_us + at_ms * 1000)
        self.clients.append(actor)
        return actor

    # -- running -------------------------------------------------------------------------------

    def run(self) -> None:
        """Run every client to its end; raises :class:`SimulationFailed`."""
        if isinstance(self.choices, SeededChoices):
            random.seed(self.choices.seed)  # (the flows' own random delays)
        self.world.reset(self.now_us)
        for (
            node
        ) in self.world.nodes:  # (each schedule loads what it runs: replayed alone, the same)
            node.client.script_flush()
        expired = self.world.expirations()
        try:
            self.observe()
            while not all(c.done or c.process.crashed for c in self.clients):
                if self.steps >= MAX_STEPS:
                    raise Violation(self.steps, "the schedule never ended: " + self._left())
                self.steps += 1
                self.ledger.step = self.steps
                self._step()
            # What was sent still arrives (what is held back on the way, when it is due).
            while self.network.deliverable() or self.network.late():
                links = self.network.deliverable()
                if links:
                    self.deliver(links[0])
                else:
                    self._advance(min(link.late_until_us for link in self.network.late()))
            self.liveness.at_end()
        except Violation as violation:
            if self.world.expirations() > expired:
                raise Stalled(f"{violation} (a key expired by a server's own clock)") from None
            raise SimulationFailed(violation, self.trace.text()) from None
        finally:
            self._shut_down()

    def _step(self) -> None:
        now = self.now_us
        faulty = self.faults.on and self.steps <= self.fault_steps
        for process in self.processes:
            if process.crash_at_us is not None and process.crash_at_us <= now:
                process.crash_at_us = None
                if self.faults.on and not process.crashed:
                    self.injected.crash(process)
                    return
        if faulty and self.choices.chance(self.faults.percent) and self.injected.fault():
            return
        ready: list[Any] = [
            actor for actor in self.scheduler.actors
            if not actor.process.crashed and not actor.process.paused(now) and actor.ready(now)
        ]  # fmt: skip
        links = self.network.deliverable()
        if faulty and links and self.choices.chance(self.faults.request_percent):
            self.injected.request_fault(self.choices.pick(links))
            return
        options = ready + links
        if not options:
            self._advance()
            return
        chosen = self.choices.pick(options)
        if isinstance(chosen, Actor):
            self._resume(chosen)
        else:
            self.deliver(chosen)

    def _resume(self, actor: Actor) -> None:
        actor.process.enter()
        self.scheduler.process = actor.process
        actor.resume()
        self.trace.add(self.now_us, actor.name, "runs", _waits(actor))
        self.injected.resumed(actor)
        if actor.done and actor.error is not None and actor in self.clients:
            error = actor.error
            if not isinstance(error, Crashed | Interrupted):
                raise Violation(self.steps, f"{actor.name} raised {error!r}") from error

    def deliver(self, link: Any) -> None:
        replies = len(link.replies)
        packet = self.network.deliver(link)
        self.scheduler.now_us += 1
        new = list(link.replies)[replies:] + (["(parked)"] if link.parked else [])
        self.trace.add(self.now_us, str(link.process), "; ".join(map(_command, packet)),
                       "; ".join(_short(reply) for reply in new))  # fmt: skip
        self.observe()

    def _advance(self, to_us: int | None = None) -> None:
        """Move time to when the first thing happens by itself (or ``to_us``)."""
        if to_us is None:
            times = [
                max(actor.wait.until_us, actor.process.paused_until_us)
                for actor in self.scheduler.actors
                if actor.wait is not None and actor.wait.until_us is not None
                and not actor.process.crashed
            ]  # fmt: skip
            times += [  # (ready, but paused)
                actor.process.paused_until_us for actor in self.scheduler.actors
                if actor.process.paused(self.now_us) and actor.ready(self.now_us)
            ]  # fmt: skip
            times += [
                link.parked.until_us for link in self.network.parked()
                if link.parked is not None and link.parked.until_us is not None
            ]  # fmt: skip
            times += [link.slow_until_us for link in self.network.slow(self.now_us)]
            times += [link.late_until_us for link in self.network.late()]
            if not times:
                raise Violation(self.steps, "nobody can move: " + self._left())
            to_us = max(min(times), self.now_us + 1)
        self.trace.add(self.now_us, "", f"time +{(to_us - self.now_us) / 1000:.3f} ms")
        self.scheduler.now_us = to_us
        self.observe()

    def observe(self) -> None:
        parked = self.network.parked()
        moved = self.now_us // 1000 - self._ttl_ms
        self._ttl_ms = self.now_us // 1000
        assert all(link.parked is not None for link in parked)
        observed = self.world.observe(
            self.now_us,
            moved,
            [link.parked.key for link in parked],  # type: ignore[union-attr]
        )
        for link, popped in zip(parked, observed.popped, strict=True):
            if popped is not None:
                self.network.woken(link, popped.encode() if isinstance(popped, str) else popped)
                self.trace.add(self.now_us, str(link.process), f"woken on {link}", repr(popped))
        for link in self.network.parked():
            assert link.parked is not None
            if link.parked.until_us is not None and link.parked.until_us <= self.now_us:
                self.network.woken(link, None)
        if observed.expired:
            self.trace.add(self.now_us, "", "expired: " + ", ".join(observed.expired))
        self.ledger.now_us = self.now_us
        self.ledger.observed(observed)
        self.liveness.observed(observed)

    def _left(self) -> str:
        return ", ".join(
            f"{actor.name} of {actor.process} waits {actor.wait}"
            for actor in self.scheduler.actors
            if not actor.done and not actor.process.crashed
        )  # fmt: skip

    # -- the end ---------------------------------------------------------------------------------

    def _shut_down(self) -> None:
        """Every thread still there (the crashed ones, the watchdogs) told to stop."""
        for process in self.processes:
            process.crashed = True
        for _ in range(3):
            for actor in list(self.scheduler.actors):
                if not actor.done and actor.wait is not None:
                    actor.throw = Crashed()
                    actor.process.enter()
                    actor.resume()


def _waits(actor: Actor) -> str:
    """What ``actor`` waits for now (after it ran)."""
    wait = actor.wait
    if actor.done:
        return f"ends ({actor.error!r})" if actor.error is not None else "ends"
    if wait is None:
        return "?"
    if wait.link is not None:
        what = f"a reply on {wait.link}"
    elif wait.links:
        what = f"a reply on {', '.join(map(str, wait.links))} or a timer"
    else:
        what = "a condition" if wait.condition is not None else "time"
    if wait.until_us is None:
        return f"waits for {what}"
    return f"waits for {what}, until +{(wait.until_us - actor.scheduler.start_us) / 1000:.3f} ms"


def _command(command: list[bytes]) -> str:
    name = command[0].decode(errors="replace").upper()
    if name in ("EVALSHA", "EVAL"):
        keys = int(command[2])
        args = [a for a in command[3 + keys :] if b"|" not in a][:5]
        first = command[3].decode(errors="replace").replace("drl-sim:", "") if keys else ""
        return f"{name.lower()} {first} " + " ".join(_short(a, 20) for a in args)
    return " ".join(_short(a, 30) for a in command[:4])


def _short(value: Any, room: int = 60) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= room else text[: room - 3] + "..."
