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
- a fault (with faults on, in the first ``fault_steps`` steps): a connection cut (what it had
  not delivered lost, and the reply it waits for), its requests held back on the way (they
  arrive, in order, that much later), a reply slowed past its reader's timeout
  (the library then sends its give-back after it), a process crashed (all its threads, its
  connections and its watchdog) or paused, a sync caller interrupted where it blocked
  (``KeyboardInterrupt``), an asyncio client's task cancelled where it is suspended
  (``aio.py``), or the server restarted empty or from a snapshot taken earlier (a failover to
  a replica that missed the writes since).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from ..choices import Choices, SeededChoices
from ..ledger import Ledger, Violation
from ..simulation import NO_FAULTS, START_US, Faults, SimulationFailed
from ..trace import Trace
from ..world import Snapshot, Stalled, World, aged, taken
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
    # Tokens whose release failed (a LockBackendError: the lease runs out by itself).
    unreleased: set[str] = field(default_factory=set)
    _snapshot: Snapshot | None = None  # (the last "snapshot" fault's)

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(START_US)
        self.network = Network(self.world, self.scheduler, self.patch)
        self.ledger.now_us = START_US
        self.liveness = Liveness(self)
        self._ttl_ms = START_US // 1000

    @property
    def now_us(self) -> int:
        return self.scheduler.now_us

    def clock(self) -> float:
        return self.scheduler.now_us / 1e6

    # -- the cast (programs.py) ------------------------------------------------------------------

    def process(self) -> SimulatedProcess:
        process = SimulatedProcess(f"p{len(self.processes) + 1}", self.scheduler.monotonic)
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
            self._observe()
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
                    self._deliver(links[0])
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
                    self._crash(process)
                    return
        if faulty and self.choices.chance(self.faults.percent) and self._fault():
            return
        ready: list[Any] = [
            actor for actor in self.scheduler.actors
            if not actor.process.crashed and not actor.process.paused(now) and actor.ready(now)
        ]  # fmt: skip
        links = self.network.deliverable()
        if faulty and links and self.choices.chance(self.faults.request_percent):
            self._request_fault(self.choices.pick(links))
            return
        options = ready + links
        if not options:
            self._advance()
            return
        chosen = self.choices.pick(options)
        if isinstance(chosen, Actor):
            self._resume(chosen)
        else:
            self._deliver(chosen)

    def _resume(self, actor: Actor) -> None:
        actor.process.enter()
        self.scheduler.process = actor.process
        actor.resume()
        self.trace.add(self.now_us, actor.name, "runs", _waits(actor))
        if actor.done and actor.error is not None and actor in self.clients:
            error = actor.error
            if not isinstance(error, Crashed | Interrupted):
                raise Violation(self.steps, f"{actor.name} raised {error!r}") from error

    def _deliver(self, link: Any) -> None:
        replies = len(link.replies)
        packet = self.network.deliver(link)
        self.scheduler.now_us += 1
        new = list(link.replies)[replies:] + (["(parked)"] if link.parked else [])
        self.trace.add(self.now_us, str(link.process), "; ".join(map(_command, packet)),
                       "; ".join(_short(reply) for reply in new))  # fmt: skip
        self._observe()

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
        self._observe()

    def _observe(self) -> None:
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

    # -- faults --------------------------------------------------------------------------------

    def _request_fault(self, link: Any) -> None:
        self.ledger.faults += 1
        kind = self.choices.pick(("lost before", "lost after", "slow", "late"))
        if kind == "lost after":
            self._deliver(link)
        if kind == "late":  # (what it sent, and will send, arrives that much later: TCP order)
            self.slow_replies += 1
            link.process.slow_replies += 1
            link.late_until_us = self.now_us + self.choices.pick((300, 2000, 8000)) * 1000
            self.trace.add(self.now_us, str(link.process), f"{link}'s requests are LATE")
            return
        if kind == "slow":
            self.slow_replies += 1
            link.process.slow_replies += 1
            self._deliver(link)
            link.slow_until_us = self.now_us + self.choices.pick((300, 2000, 8000)) * 1000
            self.trace.add(self.now_us, str(link.process), f"{link}'s reply is SLOW")
            return
        self.network.cut(link)
        self.disconnections += 1
        link.process.cuts += 1
        self.trace.add(self.now_us, str(link.process), f"{link} CUT, {kind}")

    def _fault(self) -> bool:
        now = self.now_us
        alive = [p for p in self.processes if not p.crashed]
        blocked_readers = [
            actor for actor in self.clients
            if not actor.done and actor.wait is not None and actor.wait.link is not None
            and not actor.process.crashed
        ]  # fmt: skip
        cancellable = [
            (actor, task) for actor in self.clients
            if not actor.done and actor.wait is not None and actor.wait.loop is not None
            and not actor.process.crashed
            for task in actor.wait.loop.clients if not task.done()
        ]  # fmt: skip
        kinds = ["crash", "pause", "restart", "snapshot"] if alive else ["restart", "snapshot"]
        if blocked_readers:
            kinds.append("interrupt")
        if cancellable:
            kinds.append("cancel")
        if not self.faults.restarts or not self.world.restartable():
            kinds.remove("restart")
            kinds.remove("snapshot")
        if not kinds:
            return False
        kind = self.choices.pick(kinds)
        # (An interrupt or a cancellation is no fault of the world: the ledger's checks that
        # faults switch off stay on, and nothing may be left behind.)
        self.ledger.faults += kind in ("pause", "restart")
        if kind == "crash":
            waiting = [p for p in alive if p.acquiring]
            # (Half of them in line: a dead waiter is what the queue must get past.)
            process = self.choices.pick(waiting if waiting and self.choices.chance(50) else alive)
            self._crash(process)
        elif kind == "pause":
            process = self.choices.pick(alive)
            ms = self.choices.pick((50, 500, 1000, 1500, 3000, 6000, 10_000))
            process.paused_until_us = now + ms * 1000
            self.trace.add(now, str(process), f"PAUSES for {ms} ms")
        elif kind == "interrupt":
            # (Half of them while the request is still on its way: what it sent arrives after
            # whatever the interrupted call sends next, on another connection.)
            in_flight = [a for a in blocked_readers if a.wait and a.wait.link.outbound]
            pool = in_flight if in_flight and self.choices.chance(50) else blocked_readers
            actor = self.choices.pick(pool)
            actor.throw = Interrupted("simulated: interrupted")
            self.interrupts += 1
            self.trace.add(now, actor.name, "INTERRUPTED where it waits for a reply")
        elif kind == "cancel":
            # (Half of them in a loop with a request still on its way.)
            in_flight = [
                (actor, task) for actor, task in cancellable
                if any(link.outbound for link in actor.wait.loop.readers)
            ]  # fmt: skip
            actor, task = self.choices.pick(
                in_flight if in_flight and self.choices.chance(50) else cancellable
            )
            actor.wait.loop.cancel(task)
            actor.wait.notified = True
            self.interrupts += 1
            self.trace.add(now, task.get_name(), "CANCELLED where it is suspended")
        elif kind == "snapshot":
            self._snapshot = taken(self.world, self.ledger.state, now)
            self.trace.add(now, "", "snapshot")
        else:
            self._restart()
        return True

    def _restart(self) -> None:
        """Redis restarts empty, or from the snapshot taken earlier: what a failover to a
        replica that missed the writes since does (and on a quorum, its first member)."""
        restored: dict[str, tuple[bytes, int]] | None = None
        if self._snapshot is not None and self.choices.chance(50):
            restored = aged(self._snapshot, self.now_us)
        self.disconnections += 1
        self.world.restart(restored)
        for link in self.network.links:
            self.network.cut(link)
        for process in self.processes:
            process.cuts += 1
        self.ledger.data_lost()
        what = "RESTART of Redis, empty"
        if restored is not None:
            what = "FAILOVER to a replica that missed the writes since the snapshot"
        self.trace.add(self.now_us, "", what)
        self.scheduler.now_us += 1
        self._observe()

    def _crash(self, process: SimulatedProcess) -> None:
        """``process`` dies: its threads stop where they are, its connections are cut."""
        process.crashed = True
        self.ledger.faults += 1
        self.disconnections += 1
        for link in self.network.links:
            if link.process is process:
                self.network.cut(link)
        self.trace.add(self.now_us, str(process), "CRASHES")

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
