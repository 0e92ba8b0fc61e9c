"""A guarded run: what it takes when it starts, what it finds, and what it leaves when it ends.

    run = GuardedRun(guard, guard.names(args, kwargs), job_id)
    verdict = run.enter()            # or `await run.aenter()`
    if verdict is Verdict.RUN:
        try: ...                     # the task's body
        finally: run.exit()          # or `await run.aexit()`

A run holds ``names.run`` with a renewed lease whose token carries the job's id, taking over
the job's own reservation if it has one (``until_executed``), and ends the reservation of
``names.queue`` otherwise (``until_executing``, ``until_and_while_executing``). When it ends it
leaves the job's id behind for ``DJANGO_REDIS_LOCK_TASK_DONE_TTL``, so that a copy of the job
the broker delivers again (same id) is not run a second time.

What a run can find (:class:`Verdict`):

- ``RUN``: the key is ours;
- ``FINISHED``: a run of this job ended already: this is a redelivered copy;
- ``ELSEWHERE``: another run of this job holds the key and is alive (it kept renewing for longer
  than a lease, so it is not a run that died): a copy delivered while the job runs;
- ``DUPLICATE``: another call holds the key (``run.duplicate`` says which).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time

from ..conf import lock_settings
from ..core.durations import readable
from ..exceptions import LockBackendError, LockError, LockNotOwned
from ..primitives.claims import Claim
from . import reservations
from .duplicates import IGNORE, Duplicate, decide, ignore_copy
from .policy import RAISE, RESCHEDULE, GuardNames, TaskGuard

__all__ = ["GuardedRun", "Verdict"]

logger = logging.getLogger("django_redis_lock")


class Verdict(enum.Enum):
    RUN = "run"
    FINISHED = "finished"
    ELSEWHERE = "elsewhere"
    DUPLICATE = "duplicate"


class GuardedRun:
    """One run of a guarded task (``job_id``: its task id; None for a direct call, which
    holds the run's lock without a job's token)."""

    def __init__(
        self, guard: TaskGuard, names: GuardNames, job_id: str | None,
        copy_wait: float | None = None, *, requeued_as_is: bool = True,
    ) -> None:  # fmt: skip
        """``copy_wait``: how long a copy waits for another run of its job (default
        ``guard.copy_wait()``). ``requeued_as_is``: a run put off (``reschedule``) goes back
        to its queue as the same job, reservation and all (Celery); else as a new one."""
        self.guard = guard
        self.names = names
        self.job_id = job_id
        self.copy_wait = guard.copy_wait() if copy_wait is None else copy_wait
        self.requeued_as_is = requeued_as_is
        self.lock = guard.run_lock(names.run, job_id) if names.run else None
        self.duplicate: Duplicate | None = None
        self.handed_back = False

    # -- starting ------------------------------------------------------------------------------

    def enter(self) -> Verdict:
        """Take the run's key (see the module docstring). ``LockBackendError`` when Redis
        cannot be reached, unless ``DJANGO_REDIS_LOCK_FAIL_OPEN`` lets the run go unguarded."""
        try:
            verdict = self._claimed()
            ending = self._reservation_ending(verdict)
            if ending is not None:
                reservations.cancel(*ending, using=self.guard.using)
                if self._lapsed(verdict):
                    verdict = self._claimed_again()
        except LockBackendError as error:
            return self._unguarded(error)
        except BaseException:
            # Interrupted (KeyboardInterrupt) with the run's key taken and no verdict given:
            # nobody calls exit() for it, so it goes back now, not at the end of its lease.
            if self.lock is not None and self.lock.token is not None:
                with contextlib.suppress(LockError):
                    self.lock.release()
            raise
        return verdict

    async def aenter(self) -> Verdict:
        """:meth:`enter` for asyncio."""
        try:
            verdict = await self._aclaimed()
            ending = self._reservation_ending(verdict)
            if ending is not None:
                await reservations.acancel(*ending, using=self.guard.using)
                if self._lapsed(verdict):
                    verdict = await self._aclaimed_again()
        except LockBackendError as error:
            return self._unguarded(error)
        except BaseException:
            # Cancelled with the run's key taken and no verdict given: see enter().
            if self.lock is not None and self.lock.token is not None:
                with contextlib.suppress(LockError):
                    await self.lock.arelease()
            raise
        return verdict

    def _claimed(self) -> Verdict:
        """Take the run's key: at once, or after another run of this job that died."""
        if self.lock is None:
            return Verdict.RUN
        verdict = self._judge(self.lock.claim(0, want_result=self.job_id is not None))
        if verdict is Verdict.ELSEWHERE:
            verdict = self._judge(self.lock.claim(self.copy_wait, want_result=True))
        return verdict

    async def _aclaimed(self) -> Verdict:
        if self.lock is None:
            return Verdict.RUN
        claim = await self.lock.aclaim(0, want_result=self.job_id is not None)
        verdict = self._judge(claim)
        if verdict is Verdict.ELSEWHERE:
            verdict = self._judge(await self.lock.aclaim(self.copy_wait, want_result=True))
        return verdict

    def _claimed_again(self) -> Verdict:
        """:meth:`_claimed`, after the key taken ran out (:meth:`_lapsed`)."""
        assert self.lock is not None
        with contextlib.suppress(LockError):
            self.lock.release()
        return self._claimed()

    async def _aclaimed_again(self) -> Verdict:
        assert self.lock is not None
        with contextlib.suppress(LockError):
            await self.lock.arelease()
        return await self._aclaimed()

    def _lapsed(self, verdict: Verdict) -> bool:
        """Whether the key taken for a run (``RUN``) ran out while the job's reservation was
        ended (a pause, a slow reply, past a short ``guard_timeout``): then it is asked for
        again, so that ``RUN`` means what an acquisition means, a lease not over yet."""
        if verdict is not Verdict.RUN or self.lock is None:
            return False
        until = self.lock.held_until
        return until is None or until <= time.monotonic()

    def _judge(self, claim: Claim) -> Verdict:
        if claim.acquired:
            return Verdict.RUN
        if claim.result is not None:
            return Verdict.FINISHED
        assert self.names.run is not None
        duplicate = Duplicate.of_refusal(self.names.run, claim.refusal)
        if self.job_id is not None and duplicate.task_id == self.job_id and not duplicate.queued:
            return Verdict.ELSEWHERE
        self.duplicate = duplicate
        return Verdict.DUPLICATE

    def _reservation_ending(self, verdict: Verdict) -> tuple[str, str] | None:
        """The reservation (name, job) of a queue key of its own that ends as the run starts:
        none unless the job has one, nor when the run is put off and goes back to its queue
        as the same job (reservation and all)."""
        queue, job_id = self.names.queue, self.job_id
        if queue is None or queue == self.names.run or job_id is None:
            return None
        put_off = verdict is Verdict.DUPLICATE and self.guard.on_duplicate == RESCHEDULE
        if put_off and self.requeued_as_is:
            return None
        return queue, job_id

    def _unguarded(self, error: LockBackendError) -> Verdict:
        if not lock_settings.FAIL_OPEN:
            raise error
        logger.warning(
            "Task %s runs unguarded (DJANGO_REDIS_LOCK_FAIL_OPEN): %s", self.guard.task, error
        )
        self.lock = None
        return Verdict.RUN

    def refused(self, verdict: Verdict, *, sender: type) -> str:
        """What a run that does not run (``verdict`` other than ``RUN``) does, told to the
        world (log, signal): ``IGNORE`` for another run of this very job (a copy), else its
        guard's ``on_duplicate`` (``SKIP`` or ``RESCHEDULE``); raises ``DuplicateTask`` for
        ``raise``."""
        if verdict is not Verdict.DUPLICATE:
            ignore_copy(self.guard, self.names.run or "", self.job_id, sender=sender,
                        finished=verdict is Verdict.FINISHED)  # fmt: skip
            return IGNORE
        duplicate = self.duplicate
        assert duplicate is not None
        action = decide(self.guard, duplicate, sender=sender, task_id=self.job_id, phase="run")
        if action == RAISE:
            raise duplicate.error(self.guard)
        return action

    # -- a retry -------------------------------------------------------------------------------

    def hand_back(self, name: str) -> bool:
        """The run published a retry of its job that reserves ``name``: if that is the key it
        holds, stop holding it here, so that the retry's reservation can take it over with no
        gap (and this run's end does not release it). No round trip."""
        if self.lock is None or self.names.run != name or self.lock.token is None:
            return False
        self.lock.detach()
        self.handed_back = True
        return True

    # -- ending --------------------------------------------------------------------------------

    def exit(self, *, done: bool = True) -> None:
        """Release the run's key, leaving the job's id for its copies when the job is
        ``done`` (not when it goes back to its queue: a retry, a requeue, of the same id)."""
        if self.lock is None or self.handed_back or self.lock.token is None:
            return
        try:
            if self.job_id is None or not done:
                self.lock.release()
            else:
                self.lock.release(result=self.job_id.encode(), result_ttl=self._done_ttl())
        except LockNotOwned:
            pass  # lost while it ran (said loudly already), or freed by the worker's supervisor
        except LockBackendError as error:
            self._not_released(error)

    async def aexit(self, *, done: bool = True) -> None:
        """:meth:`exit` for asyncio."""
        if self.lock is None or self.handed_back or self.lock.token is None:
            return
        try:
            if self.job_id is None or not done:
                await self.lock.arelease()
            else:
                await self.lock.arelease(result=self.job_id.encode(), result_ttl=self._done_ttl())
        except LockNotOwned:
            pass
        except LockBackendError as error:
            self._not_released(error)

    @staticmethod
    def _done_ttl() -> float:
        return lock_settings.TASK_DONE_TTL

    def _not_released(self, error: LockBackendError) -> None:
        logger.error(
            "Task %s: could not release its guard key (%s); it is free when its lease ends, "
            "within %s.", self.guard.task, error, readable(self.guard.lease),
        )  # fmt: skip
