"""The faults a schedule injects (``simulation.py``'s steps choose when): on a request (lost
before or after it ran, its reply slow, the requests of its link late), on a process (a crash,
a pause), on a caller (interrupted where it waits for a reply, and again as it cleans up; a
task cancelled where it is suspended), on the world (a snapshot; a restart, empty or from
the snapshot: a failover to a replica that missed the writes since).

The counts the invariants read (the ledger's ``faults``, the simulation's ``disconnections``,
``slow_replies``, ``crashes``, ``interrupts``, each process's ``slow_replies`` and ``cuts``)
are kept as each fault is injected.
"""

from __future__ import annotations

from typing import Any

from django_redis_lock.core.dead_holders import process_of

from ..world import Snapshot, aged, taken
from .processes import SimulatedProcess
from .threads import Actor, Interrupted

# How late a link's requests arrive, ms. 800 and 2500 arrive after the lease they renew has
# ended (a lease of 1 s or 3 s is renewed with two thirds of it left) and before the lease
# the renewal would give has (a holder that is told "renewed" still believes it holds): the
# renewal must then find the lock someone else's.
LATE_MS = (300, 800, 2000, 2500, 8000)

__all__ = ["FaultInjection"]


class FaultInjection:
    """The faults of one schedule (``sim``: its ``RuntimeSimulation``)."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self._snapshot: Snapshot | None = None  # (the last "snapshot" fault's)
        self._interrupted: set[Actor] = set()  # (actors interrupted so far)
        self._interrupt_again: set[Actor] = set()  # (at their next request)

    def resumed(self, actor: Actor) -> None:
        """``actor`` ran and blocked again: interrupted again if it was to be, now that its
        clean-up's request is on its way (Ctrl-C pressed twice)."""
        wait = actor.wait
        if actor in self._interrupt_again and wait and wait.link and wait.link.outbound:
            self._interrupt_again.discard(actor)
            actor.throw = Interrupted("simulated: interrupted again")
            self.sim.interrupts += 1
            self.sim.trace.add(self.sim.now_us, actor.name, "INTERRUPTED AGAIN as it cleans up")

    def request_fault(self, link: Any) -> None:
        """A fault of the request ``link`` is about to deliver."""
        sim = self.sim
        sim.ledger.faults += 1
        kind = sim.choices.pick(("lost before", "lost after", "slow", "late"))
        if kind == "lost after":
            sim.deliver(link)
        if kind == "late":  # (what it sent, and will send, arrives that much later: TCP order)
            sim.slow_replies += 1
            link.process.slow_replies += 1
            link.late_until_us = sim.now_us + sim.choices.pick(LATE_MS) * 1000
            sim.trace.add(sim.now_us, str(link.process), f"{link}'s requests are LATE")
            return
        if kind == "slow":
            sim.slow_replies += 1
            link.process.slow_replies += 1
            sim.deliver(link)
            link.slow_until_us = sim.now_us + sim.choices.pick((300, 2000, 8000)) * 1000
            sim.trace.add(sim.now_us, str(link.process), f"{link}'s reply is SLOW")
            return
        sim.network.cut(link)
        sim.disconnections += 1
        link.process.cuts += 1
        sim.trace.add(sim.now_us, str(link.process), f"{link} CUT, {kind}")

    def fault(self) -> bool:
        """A fault of a process, a caller or the world; False when none can happen now."""
        sim = self.sim
        now = sim.now_us
        alive = [p for p in sim.processes if not p.crashed]
        blocked_readers = [
            actor for actor in sim.clients
            if not actor.done and actor.wait is not None and actor.wait.link is not None
            and not actor.process.crashed
        ]  # fmt: skip
        cancellable = [
            (actor, task) for actor in sim.clients
            if not actor.done and actor.wait is not None and actor.wait.loop is not None
            and not actor.process.crashed
            for task in actor.wait.loop.clients if not task.done()
        ]  # fmt: skip
        kinds = ["crash", "pause", "restart", "snapshot"] if alive else ["restart", "snapshot"]
        if blocked_readers:
            kinds.append("interrupt")
        if cancellable:
            kinds.append("cancel")
        if not sim.faults.restarts or not sim.world.restartable():
            kinds.remove("restart")
            kinds.remove("snapshot")
        if not kinds:
            return False
        kind = sim.choices.pick(kinds)
        # (An interrupt or a cancellation is no fault of the world: the ledger's checks that
        # faults switch off stay on, and nothing may be left behind.)
        sim.ledger.faults += kind in ("pause", "restart")
        if kind == "crash":
            waiting = [p for p in alive if p.acquiring]
            # (Half of them in line: a dead waiter is what the queue must get past.)
            process = sim.choices.pick(waiting if waiting and sim.choices.chance(50) else alive)
            self.crash(process)
        elif kind == "pause":
            process = sim.choices.pick(alive)
            ms = sim.choices.pick((50, 500, 1000, 1500, 3000, 6000, 10_000))
            process.paused_until_us = now + ms * 1000
            sim.trace.add(now, str(process), f"PAUSES for {ms} ms")
        elif kind == "interrupt":
            # (Where one was interrupted already, half of them that one again, as it cleans
            # up: Ctrl-C pressed twice, a SIGTERM then a hard stop. Where a reply has come and
            # is not read yet, half of them there: a wake-up that handed it the lock. Else
            # half of them while the request is still on its way: what it sent arrives after
            # whatever the interrupted call sends next, on another connection.)
            again = [a for a in blocked_readers if a in self._interrupted]
            arrived = [a for a in blocked_readers if a.wait and a.wait.link.readable(now)]
            in_flight = [a for a in blocked_readers if a.wait and a.wait.link.outbound]
            if again and sim.choices.chance(50):
                pool = again
            elif arrived and sim.choices.chance(50):
                pool = arrived
            else:
                pool = in_flight if in_flight and sim.choices.chance(50) else blocked_readers
            actor = sim.choices.pick(pool)
            self._interrupted.add(actor)
            if sim.choices.chance(30):  # (and again as it cleans up: Ctrl-C pressed twice)
                self._interrupt_again.add(actor)
            # (Half of them before the read of the reply began: a caller that gives its
            # connection back to the pool whatever happened lends it with the reply unread.)
            before_read = sim.choices.aside(50, sim.interrupts)
            actor.throw = Interrupted("simulated: interrupted", before_read=before_read)
            sim.interrupts += 1
            where = "before it reads the reply" if before_read else "where it waits for a reply"
            sim.trace.add(now, actor.name, f"INTERRUPTED {where}")
        elif kind == "cancel":
            # (Half of them in a loop with a request still on its way.)
            in_flight = [
                (actor, task) for actor, task in cancellable
                if any(link.outbound for link in actor.wait.loop.readers)
            ]  # fmt: skip
            actor, task = sim.choices.pick(
                in_flight if in_flight and sim.choices.chance(50) else cancellable
            )
            actor.wait.loop.cancel(task)
            actor.wait.notified = True
            sim.interrupts += 1
            sim.trace.add(now, task.get_name(), "CANCELLED where it is suspended")
        elif kind == "snapshot":
            self._snapshot = taken(sim.world, sim.ledger.state, now)
            sim.trace.add(now, "", "snapshot")
        else:
            self._restart()
        return True

    def _restart(self) -> None:
        """Redis restarts empty, or from the snapshot taken earlier: what a failover to a
        replica that missed the writes since does (and on a quorum, its first member)."""
        sim = self.sim
        restored: dict[str, tuple[bytes, int]] | None = None
        if self._snapshot is not None and sim.choices.chance(50):
            restored = aged(self._snapshot, sim.now_us)
        sim.disconnections += 1
        sim.world.restart(restored)
        for link in sim.network.links:
            sim.network.cut(link)
        for process in sim.processes:
            process.cuts += 1
        sim.ledger.data_lost()
        what = "RESTART of Redis, empty"
        if restored is not None:
            what = "FAILOVER to a replica that missed the writes since the snapshot"
        sim.trace.add(sim.now_us, "", what)
        sim.scheduler.now_us += 1
        sim.observe()

    def crash(self, process: SimulatedProcess) -> None:
        """``process`` dies: its threads stop where they are, its connections are cut."""
        sim = self.sim
        process.crashed = True
        sim.ledger.faults += 1
        sim.disconnections += 1
        sim.crashes += 1
        for link in sim.network.links:
            if link.process is process:
                sim.network.cut(link)
        # It acts no more: its holds count for nothing from now on (the watch for dead holders
        # of another process on the host may end its leases at once: host.py).
        for facts in sim.ledger.locks.values():
            for hold in facts.holds:
                if process_of(hold.token) == process.process_id:
                    sim.ledger.ended(hold)
        sim.host.died(process)
        sim.trace.add(sim.now_us, str(process), "CRASHES")
