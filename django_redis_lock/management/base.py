"""Commands that run once across the fleet: every host sharing the Redis.

    from django_redis_lock import SingleInstanceCommand

    class Command(SingleInstanceCommand):
        lock_name = "send_invoices"        # default: the command's name
        def handle(self, *args, **options): ...

or, for an existing command class, ``class Command(SingleInstanceMixin, ExistingCommand)``.

Each run takes the lock just before ``handle()``, after Django's system checks (so that a bad
setting is their E001/E004, not a traceback), and releases it when ``handle()`` returns or
raises, and also on SIGTERM and SIGINT (the process then ends as the signal would have ended
it). The lease is renewed while the command runs. Options ``--lock-wait SECONDS`` (default 0: do
not wait) and ``--lock-timeout SECONDS`` (a fixed lease instead of a renewed one) are added to
the command.

When another instance holds the lock, the command prints one line naming it (host, pid, since
when), unless ``--verbosity 0``, and exits with ``DJANGO_REDIS_LOCK_COMMAND_EXIT_CODE``; called
through ``call_command()`` it raises :class:`AlreadyRunning` instead.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ..conf import lock_settings
from ..core import durations
from ..exceptions import LockBackendError, LockNotAcquired, LockNotOwned
from ..primitives.lock import Lock
from ..signals import lock_lost

__all__ = ["AlreadyRunning", "SingleInstanceCommand", "SingleInstanceMixin"]

logger = logging.getLogger("django_redis_lock")


class AlreadyRunning(CommandError):
    """Another instance of the command holds its lock."""

    def __init__(self, message: str, *, returncode: int, holder: LockNotAcquired) -> None:
        super().__init__(message, returncode=returncode)
        self.holder = holder


class _Stopped(BaseException):
    """A signal arrived while the command held its lock: unwind, release, then die of it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _wait_seconds(text: str) -> float:  # an argparse type
    return _seconds(text, wait=True)


def _lease_seconds(text: str) -> float:  # an argparse type; 0 means the renewed default
    return 0.0 if _seconds(text, wait=True) == 0 else _seconds(text, wait=False)


def _seconds(text: str, *, wait: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    try:
        return durations.seconds(value, "it", wait=wait, allow_inf=wait)
    except ValueError as exc:  # the rule a Lock's own arguments follow
        raise argparse.ArgumentTypeError(str(exc).removeprefix("it ")) from None


class SingleInstanceMixin:
    """Make a management command run at most once at a time across every host."""

    #: The lock's name; default: the command's name.
    lock_name: str | None = None
    #: Default for ``--lock-wait``: seconds to wait for a running instance to finish.
    lock_wait: float = 0
    #: Default for ``--lock-timeout``: None means a renewed lease of DJANGO_REDIS_LOCK_TIMEOUT.
    lock_timeout: float | None = None

    _command_name: str | None = None
    _from_command_line = False

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # Here rather than in add_arguments(), which subclasses override without super().
        parser: CommandParser = super().create_parser(prog_name, subcommand, **kwargs)  # type: ignore[misc]
        self._command_name = subcommand
        group = parser.add_argument_group("single instance (django-redis-lock)")
        group.add_argument(
            "--lock-wait", type=_wait_seconds, default=None, metavar="SECONDS",
            help=f"wait this long for a running instance to finish (default {self.lock_wait})",
        )  # fmt: skip
        group.add_argument(
            "--lock-timeout", type=_lease_seconds, default=None, metavar="SECONDS",
            help="a fixed lease in seconds instead of a renewed one",
        )  # fmt: skip
        return parser

    def get_lock_name(self, *args: Any, **options: Any) -> str:
        """The lock's name for this run; override to lock per argument (e.g. per tenant)."""
        if self.lock_name:
            return self.lock_name
        return self._command_name or type(self).__module__.rsplit(".", 1)[-1]

    def execute(self, *args: Any, **options: Any) -> Any:
        # Django's own execute() runs the system checks first (as the command asks, unless
        # --skip-checks), then handle(): the lock is taken there, just before handle(), so a
        # bad setting of ours is the checks' E001/E004 as for any command, not a traceback.
        command = cast(Any, self)
        command.handle = functools.partial(self._handle_locked, command.handle)
        try:
            return super().execute(*args, **options)  # type: ignore[misc]
        finally:
            del command.handle  # the class's own again

    def _handle_locked(self, handle: Callable[..., Any], *args: Any, **options: Any) -> Any:
        """``handle(*args, **options)`` while holding the command's lock."""
        try:
            if not lock_settings.ENABLED:
                return handle(*args, **options)
            wait = options.get("lock_wait")
            timeout = options.get("lock_timeout")
            name = self.get_lock_name(*args, **options)
            lock = Lock(
                name,
                wait=self.lock_wait if wait is None else wait,
                timeout=(self.lock_timeout if timeout is None else timeout) or None,
                label=f"manage.py {self._command_name or name}",
            )
            lock.__enter__()
        except LockNotAcquired as holder:
            running = AlreadyRunning(
                f"Not running: another instance holds the lock. {holder}.",
                returncode=lock_settings.COMMAND_EXIT_CODE,
                holder=holder,
            )
            if not self._from_command_line:
                raise running from None
            # Not Django's "AlreadyRunning: ..." for a CommandError: one plain line, and none
            # with --verbosity 0 (cron mails whatever a job prints).
            if options.get("verbosity", 1) > 0:
                sys.stderr.write(f"{running}\n")
            sys.exit(running.returncode)
        except ImproperlyConfigured as exc:
            # A bad setting the system checks did not stop (--skip-checks): said as they would.
            check = getattr(exc, "check_id", None)
            raise CommandError(f"Not running: {exc}" + (f" ({check})" if check else "")) from exc
        except LockBackendError as exc:
            if not lock_settings.FAIL_OPEN:
                raise CommandError(f"Not running: {exc}") from exc
            logger.warning(
                "Running %s without its lock (DJANGO_REDIS_LOCK_FAIL_OPEN): %s", name, exc
            )
            return handle(*args, **options)
        with self._stop_on_signals(lock):
            try:
                return handle(*args, **options)
            finally:
                # A lost lock was reported when it was lost (ERROR, lock_lost); a release
                # that cannot reach Redis leaves a lease that ends by itself.
                with contextlib.suppress(LockNotOwned, LockBackendError):
                    lock.release()

    def run_from_argv(self, argv: list[str]) -> None:
        self._from_command_line = True
        super().run_from_argv(argv)  # type: ignore[misc]

    @contextlib.contextmanager
    def _stop_on_signals(self, lock: Lock) -> Iterator[None]:
        """SIGTERM and SIGINT unwind through the release; a lost lease may stop the run."""
        main = threading.current_thread() is threading.main_thread()
        lost = threading.Event()

        def on_lost(sender: Any, **kwargs: Any) -> None:
            if kwargs.get("lock") is not lock:
                return
            lost.set()
            if main and lock_settings.COMMAND_ON_LOST == "abort":
                # Interrupt the main thread even in a blocking call, like Ctrl-C would.
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

        def stop(signum: int, frame: Any) -> None:
            raise _Stopped(signum)

        previous: dict[int, Any] = {}
        if main:
            for handled in (signal.SIGINT, signal.SIGTERM):
                previous[handled] = signal.signal(handled, stop)
        lock_lost.connect(on_lost, weak=False)
        try:
            yield
        except _Stopped as stopped:
            if lost.is_set():
                raise CommandError(
                    f"Stopped: the lock {lock.name!r} was lost, so another instance may be "
                    "running now (DJANGO_REDIS_LOCK_COMMAND_ON_LOST = 'abort')."
                ) from None
            # The lock is released by now: end the way the signal would have ended us.
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            previous.clear()
            signal.raise_signal(stopped.signum)
            raise SystemExit(128 + stopped.signum) from None
        finally:
            lock_lost.disconnect(on_lost)
            for signum, handler in previous.items():
                signal.signal(signum, handler)


class SingleInstanceCommand(SingleInstanceMixin, BaseCommand):
    """A ``BaseCommand`` that runs at most once at a time across every host."""
