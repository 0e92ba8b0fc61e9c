"""Signals sent by the lock engine. Each is sent with ``sender=Lock`` (the class; a semaphore's
with ``sender=Semaphore``, its ``lock`` the Semaphore) and these keyword arguments:

``lock_acquired``        lock, name, label, waited (seconds spent waiting), fencing_token
``lock_released``        lock, name, label, held (seconds)
``lock_contended``       lock, name, label, owner (holder's owner record, or None): an
                         acquisition found the lock held and is about to wait
``lock_not_acquired``    lock, name, label, waited (seconds), outcome: an acquisition ended
                         without the lock: ``"timed_out"`` (its wait ran out), ``"error"``
                         (Redis failed; the caller gets the error), or ``"done"`` (it asked for
                         the holder's result, ``want_result``, and got it instead: a duplicate
                         submission replayed, a task's copy)
``lock_lost``            lock, name, label, held (seconds since acquired), reason (str): a lease
                         ended while its holder believed it held the lock
``lock_force_released``  name, token, owner (the record that was released), by (who asked)
``run_skipped``          name, owner (the running one's record, or None): a ``@single_instance``
                         run was skipped because another run held its lock (sent with
                         ``sender=single_instance``)
``task_duplicate_found`` name (the guard key's lock), task (the task's name), task_id (the
                         duplicate's id, None when it was never queued), duplicate_of (the
                         queued or running task's id, or None), queued (bool: that one waits in
                         its queue), phase ("enqueue" or "run"), action (what was done: an
                         ``on_duplicate`` value, or "ignore" for a copy of a task that runs or
                         ran already): a task guard found a duplicate (sent with
                         ``sender=GuardedTask``, or ``GuardedBackend`` for django.tasks)

Receivers run in the thread that sends: ``lock_lost`` usually comes from the renewal thread.
"""

from django.dispatch import Signal

__all__ = [
    "lock_acquired",
    "lock_contended",
    "lock_force_released",
    "lock_lost",
    "lock_not_acquired",
    "lock_released",
    "run_skipped",
    "task_duplicate_found",
]

lock_acquired = Signal()
lock_released = Signal()
lock_contended = Signal()
lock_not_acquired = Signal()
lock_lost = Signal()
lock_force_released = Signal()
run_skipped = Signal()
task_duplicate_found = Signal()
