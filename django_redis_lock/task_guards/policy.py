"""What one task's guard is: its mode, its key, what it does with a duplicate, and the names of
the locks it takes, for Celery's ``GuardedTask`` and django.tasks' ``GuardedBackend`` alike.

The modes (sidekiq-unique-jobs' words):

- ``until_executing``: no duplicate waits in the queue; the key is reserved when the task is
  queued and freed when its run starts;
- ``while_executing``: no two runs at once; the key is held (a renewed lease) while it runs;
- ``until_executed``: from queueing to the end of the run, one key held throughout (the run takes
  the reservation over);
- ``until_and_while_executing``: no duplicate in the queue, and no two runs at once; a duplicate
  may be queued once the first has started.

Lock names: ``task:<task name>:<key>`` (reserved, and held by ``until_executed`` runs and
``while_executing`` runs), and ``task:<task name>:<key>:running`` for the runs of
``until_and_while_executing``, which may overlap a queued duplicate's reservation.
"""

from __future__ import annotations

import datetime
import decimal
import inspect
import json
import string
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..conf import lock_settings
from ..core import durations
from ..guards.decorators import name_maker
from ..primitives.lock import Lock

__all__ = [
    "MODES",
    "ON_DUPLICATE",
    "RAISE",
    "RESCHEDULE",
    "RETURN_EXISTING",
    "SKIP",
    "UNTIL_AND_WHILE_EXECUTING",
    "UNTIL_EXECUTED",
    "UNTIL_EXECUTING",
    "WHILE_EXECUTING",
    "GuardNames",
    "TaskGuard",
    "canonical_arguments",
]

WHILE_EXECUTING = "while_executing"
UNTIL_EXECUTING = "until_executing"
UNTIL_EXECUTED = "until_executed"
UNTIL_AND_WHILE_EXECUTING = "until_and_while_executing"
MODES = (UNTIL_EXECUTED, UNTIL_EXECUTING, WHILE_EXECUTING, UNTIL_AND_WHILE_EXECUTING)

RETURN_EXISTING = "return_existing"
RAISE = "raise"
SKIP = "skip"
RESCHEDULE = "reschedule"
ON_DUPLICATE = (RETURN_EXISTING, RAISE, SKIP, RESCHEDULE)

# A run of a job finds another run of the same job (a redelivered copy) holding its key: it
# waits this much longer than a lease, so that a run that died (its lease no longer renewed)
# hands it over, while one that is alive keeps it.
_COPY_WAIT_SLACK = 1.0


@dataclass(frozen=True)
class GuardNames:
    """The locks of one call: ``queue`` is reserved while it waits in its queue, ``run`` held
    while it runs (None: this mode has none)."""

    queue: str | None
    run: str | None


class TaskGuard:
    """One task's guard (its options checked here, once, when the task is defined).

    ``task``: the task's name (Celery's ``task.name``, django.tasks' module path); ``func``:
    the function whose parameters the key is made of; ``label``: how the admin describes its
    locks. The other options are the task's (see ``docs/tasks.md``)."""

    def __init__(
        self,
        task: str,
        func: Callable[..., Any],
        *,
        label: str,
        guard: str = UNTIL_EXECUTED,
        guard_key: str | Callable[..., str] | None = None,
        on_duplicate: str = RETURN_EXISTING,
        guard_timeout: float | None = None,
        guard_queued_timeout: float | None = None,
        guard_using: str | None = None,
        skip_first_parameter: bool = False,
    ) -> None:
        if guard not in MODES:
            raise ValueError(f"guard must be one of {_listed(MODES)}, not {guard!r}.")
        if on_duplicate not in ON_DUPLICATE:
            raise ValueError(
                f"on_duplicate must be one of {_listed(ON_DUPLICATE)}, not {on_duplicate!r}."
            )
        if on_duplicate == RESCHEDULE and guard == UNTIL_EXECUTING:
            raise ValueError(
                "on_duplicate='reschedule' puts off a run that finds another running, and "
                "guard='until_executing' guards no run: use 'until_and_while_executing' to "
                "also keep runs apart, or another on_duplicate."
            )
        if guard_key is not None and not callable(guard_key) and not isinstance(guard_key, str):
            raise TypeError(
                "guard_key must be a template (a str such as '{customer_id}'), a callable of "
                f"the task's arguments, or None (all of them), not {type(guard_key).__name__}."
            )
        if guard_using is not None and (not isinstance(guard_using, str) or not guard_using):
            raise TypeError(f"guard_using must be a cache alias (a str), not {guard_using!r}.")
        self.task = task
        self.label = label
        self.mode = guard
        self.on_duplicate = on_duplicate
        self.timeout = None if guard_timeout is None else (
            durations.seconds(guard_timeout, "guard_timeout")
        )  # fmt: skip
        self.queued_timeout = None if guard_queued_timeout is None else (
            durations.seconds(guard_queued_timeout, "guard_queued_timeout")
        )  # fmt: skip
        self.using = guard_using
        signature = inspect.signature(func)
        if skip_first_parameter:  # django.tasks' context
            parameters = list(signature.parameters.values())[1:]
            signature = signature.replace(parameters=parameters)
        self.signature = signature
        if isinstance(guard_key, str):
            _check_template(guard_key, signature, task)
        if guard_key is None:
            self._key: Callable[..., str] = self._canonical
        else:
            template_of = _Signed(func, signature)  # a template is filled from these parameters
            self._key = name_maker(guard_key, template_of)

    def __repr__(self) -> str:
        return f"<TaskGuard {self.task} {self.mode}>"

    @property
    def reserves(self) -> bool:
        """Whether a call is reserved when it is queued."""
        return self.mode != WHILE_EXECUTING

    def key(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The guard key of a call (what tells duplicates apart)."""
        key = self._key(*args, **kwargs)
        if not isinstance(key, str):
            raise TypeError(f"guard_key of {self.task} gave {type(key).__name__}, not a str.")
        return key

    def names(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> GuardNames:
        key = self.key(args, kwargs)
        base = f"task:{self.task}:{key}" if key else f"task:{self.task}"
        if self.mode == UNTIL_EXECUTING:
            return GuardNames(base, None)
        if self.mode == WHILE_EXECUTING:
            return GuardNames(None, base)
        if self.mode == UNTIL_EXECUTED:
            return GuardNames(base, base)
        return GuardNames(base, f"{base}:running")

    @property
    def group(self) -> str:
        """The metrics group of the task's locks: ``task:<name>``, whatever its arguments."""
        return f"task:{self.task}"

    @property
    def lease(self) -> float:
        """The lease of a run's lock, renewed while it runs."""
        return self.timeout if self.timeout is not None else lock_settings.TIMEOUT

    def run_lock(self, name: str, job_id: str | None) -> Lock:
        """The lock a run holds: renewed while it runs, taking its job's reservation over."""
        return Lock(
            name, timeout=self.lease, auto_renew=True, wait=0, label=self.label,
            guard=self.mode, using=self.using, job_id=job_id, group=self.group,
        )  # fmt: skip

    def copy_wait(self) -> float:
        """How long a redelivered copy waits for another run of its job (see above)."""
        return self.lease + _COPY_WAIT_SLACK

    def queued_ttl(self, delay: float = 0.0, expires_in: float | None = None) -> float:
        """The lease of a reservation for a call that runs after ``delay`` seconds at the
        earliest (a countdown or eta), and is dropped after ``expires_in`` (its expiry)."""
        base = self.queued_timeout or lock_settings.TASK_QUEUED_TIMEOUT
        ttl = base + max(0.0, delay)
        if expires_in is not None:
            ttl = min(ttl, max(expires_in, 0.0) + _COPY_WAIT_SLACK)
        return min(max(ttl, durations.MIN_SECONDS), durations.MAX_SECONDS)

    def _canonical(self, *args: Any, **kwargs: Any) -> str:
        return canonical_arguments(self.signature, args, kwargs)


def canonical_arguments(
    signature: inspect.Signature, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str:
    """A call's arguments as one string, the same however they were passed: bound to their
    parameters (defaults filled in), ``name=<JSON>`` in the parameters' order. ``sync(42)``,
    ``sync(customer_id=42)`` and ``sync(42, full=False)`` give the same key."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return ",".join(f"{name}={_json(name, value)}" for name, value in bound.arguments.items())


def _json(name: str, value: Any) -> str:
    def plain(item: Any) -> Any:
        # What Celery's and django.tasks' JSON serializers accept besides JSON's own types.
        if isinstance(item, datetime.datetime | datetime.date | datetime.time):
            return item.isoformat()
        if isinstance(item, decimal.Decimal | uuid.UUID):
            return str(item)
        if isinstance(item, set | frozenset):
            return sorted(item, key=repr)
        raise TypeError(
            f"Cannot make a guard key of argument {name!r}: {type(item).__name__} is not "
            "JSON. Give the task a guard_key (a template or a callable) instead."
        )

    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=plain
    )


def _check_template(template: str, signature: inspect.Signature, task: str) -> None:
    """``ValueError`` now, rather than a ``KeyError`` at the first call, for a template that
    names a parameter the task does not have."""
    parameters = list(signature.parameters)
    any_index = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(template) if field]
    except ValueError as exc:
        raise ValueError(f"guard_key {template!r} of {task} is not a template: {exc}") from None
    for field in fields:
        first = field.split(".", 1)[0].split("[", 1)[0]
        if first in parameters or (
            first.isdigit() and (any_index or int(first) < len(parameters))
        ):
            continue
        raise ValueError(
            f"guard_key {template!r} of {task} names {first!r}, which is not one of its "
            f"parameters ({', '.join(parameters) or 'none'})."
        )


class _Signed:
    """A stand-in function with ``signature``, for ``name_maker``'s templates (django.tasks'
    context is not a parameter of the key)."""

    def __init__(self, func: Callable[..., Any], signature: inspect.Signature) -> None:
        self.__signature__ = signature
        self.__name__ = getattr(func, "__name__", "task")

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def _listed(choices: Sequence[str]) -> str:
    return ", ".join(map(repr, choices))
