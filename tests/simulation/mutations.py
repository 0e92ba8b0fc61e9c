"""Deliberate bugs, to show that the simulation finds each: a script's source with one rule
taken out. ``MUTATIONS[name]`` is ``(script, the text to replace, what replaces it, the
workload that should notice)``; :func:`patch_for` makes the ``patch`` that
``server.simulated_scripts`` applies.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["CODE_MUTATIONS", "MUTATIONS", "RUNTIME_ONLY", "mutated_code", "patch_for"]

# lock_many's checks of its members as the group completes (primitives/group.py).
_GROUP_CHECKS = """\
                if now_left == 0 or now_left < left[id(member)] / 2:
                    try:
                        yield Refresh(member)
                    except LockNotOwned:
                        taken.remove(member)
                        yield from self._undo(taken)
                        return Claim(False, refusal=LockNotAcquired(member.name, waited=wait))
            # A refresh learnt of only after the lease it gave had ended (its reply slower than
            # the lease) gives nothing to count on, and a member may run out while a later
            # one is refreshed: the group is held only while each member's lease is.
            ended = next((member for member in taken if self._left(member) == 0), None)
            if ended is not None:"""

MUTATIONS: dict[str, tuple[str, str, str, str]] = {
    # The double run of issue 27: a waiter that finds the lease handed to it is not told that
    # the guarded work is done (only the wake-up message, which may come late, said so).
    "join forgets the result": (
        "join",
        "if wants_result(flags) and done(flags, redis.call('GET', KEYS[5]), token) then "
        "finished = '1' end",
        "",
        "want_result",
    ),
    # A release that does not check whose lease it ends.
    "release ignores the token": (
        "release",
        "if string.sub(value, 1, #token + 1) ~= token .. '|' then",
        "if false then",
        "lock",
    ),
    # A renewal that lengthens whichever lease is there.
    "extend ignores the token": (
        "extend",
        "string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|'",
        "false",
        "lock",
    ),
    # A queue join that does not say when it queued: a wake-up pushed late, after the lease it
    # handed had ended, is taken for a grant again (found by a campaign, fixed since).
    "join forgets when it queued": (
        "join",
        "joined = string.format('%.0f', micros)",
        "joined = false",
        "lock",
    ),
    # fair=False without its bound: a waiter is left to compete for a free lock for ever.
    "unfair release never serves the starved": (
        "release",
        "if now - since >= bound then break end",
        "",
        "lock",
    ),
    # A semaphore that counts one permit too many.
    "semaphore miscounts": (
        "permit_acquire",
        "local free = limit - redis.call('ZCARD', KEYS[1])",
        "local free = limit + 1 - redis.call('ZCARD', KEYS[1])",
        "semaphore",
    ),
}


def patch_for(mutation: str) -> Callable[[str, str], str]:
    script, old, new, _ = MUTATIONS[mutation]

    def patch(name: str, source: str) -> str:
        if name != script:
            return source
        if old not in source:
            raise AssertionError(f"mutation {mutation!r}: {old!r} is no longer in {name}.lua")
        return source.replace(old, new, 1)

    return patch


# -- the library's own code: for the runtime simulation (runtime/) -----------------------------
# ``CODE_MUTATIONS[name]`` is ``(module, function's qualified name, the text to replace, what
# replaces it, the workload that should notice)``; :func:`mutated_code` applies one for as long
# as it is entered (in the process that runs schedules: ``runtime/__main__.py``). Script
# mutations above apply to the runtime simulation too, through its network's scripts.
CODE_MUTATIONS: dict[str, tuple[str, str, str, str, str]] = {
    # lock_many keeps what it took when a later name is refused (issue 42's first class).
    "lock_many keeps what it took": (
        "django_redis_lock.primitives.group",
        "LockGroup._acquisition",
        "                    yield from self._undo(taken)\n"
        "                    return Claim(False, refusal=claim.refusal)",
        "                    return Claim(False, refusal=claim.refusal)",
        "many",
    ),
    # A request whose reply did not come in time is not followed by its give-back (the second).
    "no give-back after a lost reply": (
        "django_redis_lock.backends.wire",
        "execute",
        "        except RedisTimeoutError:\n            give_back_behind(connection, if_silent)",
        "        except RedisTimeoutError:\n            pass",
        "lock",
    ),
    # A grant learnt of at the very end of its lease is used (the third: an off-by-one).
    "a grant used at its lease's last moment": (
        "django_redis_lock.core.uncontended",
        "learnt_late",
        "return now >= sent_at + lease_ms / 1000",
        "return now > sent_at + lease_ms / 1000",
        "lock",
    ),
    # lock_many does not look at its members' leases when the group completes: a member taken
    # first is not made whole again, and one whose lease ended is counted held (found by this
    # simulation: a member that lapsed while a later one was waited for). Both rules go: each
    # alone keeps a lapsed member out of a group said held.
    "lock_many forgets a lapsed member": (
        "django_redis_lock.primitives.group",
        "LockGroup._acquisition",
        _GROUP_CHECKS,
        _GROUP_CHECKS.replace(
            "if now_left == 0 or now_left < left[id(member)] / 2:", "if False:"
        ).replace("if ended is not None:", "if False:"),
        "many",
    ),
    # asyncio: a task cancelled as its acquisition was granted does not give the grant back
    # (the class an adversarial review found: a lease by nobody).
    "a cancelled acquisition keeps its grant": (
        "django_redis_lock.backends.drivers",
        "arun",
        "            if give_back is not None:\n                await give_back(stop.value)",
        "            if False:\n                await give_back(stop.value)",
        "async",
    ),
    # ... nor what its request took when the reply came after the cancellation (the carried
    # request's give-back: the uncontended path's, a join's).
    "a cancelled request keeps what it took": (
        "django_redis_lock.backends.inflight",
        "carried",
        "    if give_back is not None and not (done.cut and gives_back_when_cut):",
        "    if False:",
        "async",
    ),
    # A queue join whose reply did not come within the socket timeout (held up on its way)
    # leaves what it took when it arrives: its give-back does not follow it (found by this
    # simulation's campaign: a lease by nobody for a whole lease).
    "a join held up on its way keeps what it took": (
        "django_redis_lock.backends.waits",
        "run_then_wait",
        "            if isinstance(error, RedisTimeoutError):\n"
        "                give_back_behind(connection, if_silent)",
        "            if False:\n                give_back_behind(connection, if_silent)",
        "lock",
    ),
    # Quorum mode: an acquisition interrupted with its requests out leaves what they took on
    # the servers (a majority's SET NX, held for a whole lease by nobody).
    "an interrupted quorum acquisition keeps what it took": (
        "django_redis_lock.backends.quorum.backend",
        "QuorumBackend.send",
        "        if if_silent is None:",
        "        if True:",
        "lock",
    ),
    # The guards' own code (runtime/guarded.py). A response kept for duplicates is replayed
    # to a shared identity too (an office's address, a header): one person is shown another's.
    "a replay reaches a shared identity": (
        "django_redis_lock.guards.double_submit",
        "_SubmissionGuard.plan",
        "            replayable=self.replay and personal,",
        "            replayable=self.replay,",
        "guards",
    ),
    # Two forms that differ only in their fields share a fingerprint: the order of a pen is
    # answered with the response to the order of a book.
    "a fingerprint two forms share": (
        "django_redis_lock.guards.submissions",
        "request_fingerprint",
        "            if name not in _IGNORED_FIELDS\n",
        "            if False\n",
        "guards",
    ),
    # run_once marks a job done though its run failed: the next delivery never runs it.
    "run_once marks a failed run done": (
        "django_redis_lock.guards.run_once",
        "run_once._finishing",
        "return lock, (_DONE if exc_type is None else None)",
        "return lock, _DONE",
        "guards",
    ),
    # A duplicate handed the lock after the work was done reads the result before it passes
    # the lock on: interrupted while it reads, it holds the lease it was handed, by nobody,
    # for a hand-off (found by this simulation's campaign).
    "a duplicate reads the result before it passes the lock on": (
        "django_redis_lock.core.flows",
        "_result_instead",
        "    yield from release(keys, plan.token, granted.next_token, cleanup=True)\n"
        '    result = yield Command(("GET", keys.result_of(plan.token)))\n',
        '    result = yield Command(("GET", keys.result_of(plan.token)))\n'
        "    yield from release(keys, plan.token, granted.next_token, cleanup=True)\n",
        "want_result",
    ),
    # A leave whose reply is not read (its caller interrupted again) does not give back the
    # lease it found handed to it (found by this simulation's campaign: held by nobody for
    # the rest of a hand-off).
    "a leave interrupted again keeps a lease handed to it": (
        "django_redis_lock.core.flows",
        "_leave",
        "cleanup=True, give_back=give_back(keys, plan.token)",
        "cleanup=True",
        "many",
    ),
    # The task guards' own code (runtime/queued.py). A run's key that ran out while the
    # job's reservation was ended (a pause) is used all the same (found by this simulation).
    "a run uses a key that ran out as its reservation ended": (
        "django_redis_lock.task_guards.runs",
        "GuardedRun._lapsed",
        "        return until is None or until <= time.monotonic()",
        "        return False",
        "tasks",
    ),
    # A run's end does not leave its job's id: a copy the broker delivers again runs again.
    "a run's end leaves no job id": (
        "django_redis_lock.task_guards.runs",
        "GuardedRun.exit",
        "                self.lock.release(result=self.job_id.encode(), "
        "result_ttl=self._done_ttl())",
        "                self.lock.release()",
        "tasks",
    ),
    # One record of a finished job per key, not per job: a copy of an earlier job, delivered
    # again after a later job of its key finished, runs again (found by this simulation's
    # campaign).
    "a job's record is the key's": (
        "django_redis_lock.core.lease",
        "LockKeys.result_of",
        '        return self.result if job is None else f"{self.result}:{job}{JOB_SEPARATOR}"',
        "        return self.result",
        "tasks",
    ),
    # lock_many counts a member's refresh learnt of only after the lease it gave had ended
    # (its reply slower than the lease: a slot map read again, a late link), and says it
    # holds a group whose member's lease has ended by its own reckoning (found by this
    # simulation on a Cluster).
    "lock_many counts a refresh learnt too late": (
        "django_redis_lock.primitives.group",
        "LockGroup._acquisition",
        "            if ended is not None:",
        "            if False:",
        "many",
    ),
    # A quorum's script interrupted before its NOSCRIPT was answered never goes out whole: a
    # release interrupted twice on members that do not have its script yet (their first
    # call of it, or after a restart) leaves the lease on them (found by this simulation's
    # campaign).
    "an interrupted quorum script never goes out whole": (
        "django_redis_lock.backends.quorum.broadcast",
        "Broadcaster.send",
        "            if whole is not None:  # (those sent it that have not answered, nor had it "
        "whole)",
        "            if False:",
        "guards",
    ),
    # On a Cluster, a sync acquisition whose reply is not read (interrupted, timed out) sends
    # no give-back: what it took is held by nobody for a lease (found by this simulation on
    # a Cluster).
    "a cluster acquisition interrupted keeps what it took": (
        "django_redis_lock.backends.cluster_wire",
        "execute_on_cluster",
        "            return execute(node_client(cluster, key), *args, if_silent=if_silent)",
        "            return execute(node_client(cluster, key), *args, if_silent=None)",
        "lock",
    ),
    # On a Cluster, a command interrupted between its send and its read goes back to its pool
    # with its reply unread (redis-py's Cluster client does that: here a SCRIPT LOAD), and the
    # next caller on that connection reads it as its own.
    "a cluster connection interrupted is lent again unread": (
        "django_redis_lock.backends.cluster_wire",
        "execute_on_cluster",
        "                return [execute(primary, *args) for primary in primaries][-1]",
        "                return cluster.execute_command(*args)",
        "lock",
    ),
    # The watch for dead holders (runtime/host.py). lock_many takes its members in one
    # script without writing this process's record first: its death is never seen (found by
    # this simulation), and its locks wait out their leases.
    "a group taken in one script leaves no record": (
        "django_redis_lock.primitives.group_steps",
        "Members.perform",
        "            pendings[0][0].before_acquiring()",
        "            pass",
        "many",
    ),
    # The watch takes a live holder for dead, and ends its lease under it.
    "the watch takes a live holder for dead": (
        "django_redis_lock.primitives.background.dead_holders",
        "_Deaths._sighted",
        "            if dead(record, process_records.here(), "
        "process_records.started(record.pid)):",
        "            if True:",
        "lock",
    ),
    # A cancelled waiter goes without stepping out of the line.
    "a cancelled waiter stays in line": (
        "django_redis_lock.backends.drivers",
        "arun",
        "            error = cancelled  # told now, in this step's stead\n            continue",
        "            raise cancelled",
        "async",
    ),
}

# Scripts' mutations that only the runtime simulation is asked to find (its faults reach them).
MUTATIONS.update({
    # A dead semaphore waiter is never pruned: counted alive while a permit is free (the
    # fourth class), keeping the live ones behind it out.
    "a dead semaphore waiter is never pruned": (
        "permit_acquire",
        "if entry and tonumber(string.match(entry, '^(%d+)|')) >= now then",
        "if entry then",
        "semaphore",
    ),
    # A request that comes after its own leave does not see the mark the leave left: a join
    # overtaken by its leave queues a token nobody waits for (found by this simulation).
    "a leave overtaken by its join": (
        "permit_acquire",
        "if mode ~= 3 and left_already(KEYS[5]) then",
        "if false then",
        "semaphore",
    ),
    # A wake-up pushed without its list's expiry (as a Cluster's one-by-one push and expiry
    # could leave it, its sender gone between the two: found by this simulation on a
    # Cluster, and made one script since).
    "a wake-up pushed without its expiry": (
        "wake",
        "  redis.call('PEXPIRE', key, ARGV[2 * i])\n",
        "",
        "many",
    ),
})  # fmt: skip

# Which simulation is asked to find each: the flows' (the suite's Hypothesis share) or the
# runtime one (runtime/).
RUNTIME_ONLY = (
    "a dead semaphore waiter is never pruned",
    "a leave overtaken by its join",
    *CODE_MUTATIONS,
)


@contextlib.contextmanager
def mutated_code(mutation: str) -> Iterator[None]:
    """The library's code with ``mutation`` (``CODE_MUTATIONS``) applied while inside: the
    function is compiled again from its changed source, and put where the original was, in
    its module or class and in every module that imported it by name."""
    module_name, qualname, old, new, _ = CODE_MUTATIONS[mutation]
    module = importlib.import_module(module_name)
    owner: Any = module
    *outer, name = qualname.split(".")
    for part in outer:
        owner = getattr(owner, part)
    original = inspect.getattr_static(owner, name)
    function = original.__func__ if isinstance(original, staticmethod) else original
    source = inspect.getsource(function)
    if old not in source:
        raise AssertionError(f"mutation {mutation!r}: {old!r} is no longer in {qualname}")
    changed = textwrap.dedent(source.replace(old, new, 1))
    namespace = dict(vars(module))
    exec(compile(changed, inspect.getfile(function), "exec"), namespace)
    replacement = namespace[name]
    if isinstance(original, staticmethod):
        replacement = staticmethod(replacement)
    importers = [
        other for other in list(sys.modules.values())
        if other is not None and other is not owner and getattr(other, name, None) is function
    ]  # fmt: skip
    setattr(owner, name, replacement)
    for other in importers:
        setattr(other, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)
        for other in importers:
            setattr(other, name, function)
