"""Real task-queue workers in subprocesses, for the tests and the benchmarks: Celery's prefork
worker (``tests/support/celery_app.py``) and django-tasks-db's ``db_worker``.

Each runs in a session of its own, dies with the thread that started it (a killed test run
leaves no worker behind), and writes its output to a log file that ``wait_for_log`` reads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from dev.embedded_redis import die_with_parent
from tests.support.helpers import wait_for_exit, wait_until

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """One worker: ``command`` run from the repository's root with ``env`` added, its output
    in ``log_path``; started when ``ready`` appears in its log."""

    def __init__(
        self, command: Sequence[str], env: dict[str, str], log_path: Path, ready: str
    ) -> None:
        self.command = list(command)
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.ready = ready
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> WorkerProcess:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
        self.wait_for_log(self.ready, timeout=timeout, what="the worker to start")
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for_log(self, text: str, timeout: float = 30, what: str | None = None) -> None:
        def seen() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"the worker exited ({self.process.returncode}):\n{self.log}")
            return text in self.log

        wait_until(seen, timeout=timeout, what=what or f"{text!r} in the worker's log")

    def children(self) -> list[int]:
        """The worker's child processes (a prefork pool's)."""
        path = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        return [int(pid) for pid in path.read_text().split()] if path.exists() else []

    def kill(self) -> None:
        """SIGKILL the whole worker, main process and pool (a container or machine lost)."""
        assert self.process is not None
        self._kill_session()
        self.process.wait(10)

    def stop(self, timeout: float = 15) -> None:
        """A warm shutdown (SIGTERM), then SIGKILL to the whole session if it lingers."""
        if self.process is None or self.process.poll() is not None:
            self._kill_session()
            return
        self.process.terminate()
        if not wait_for_exit(self.pid, timeout):
            self._kill_session()
        self.process.wait(10)

    def _kill_session(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)


def redelivering(seconds: float) -> dict[str, float]:
    """A Redis broker's transport options that deliver a message again when it was not
    acknowledged within ``seconds``, looking every second (its default looks far less often)."""
    return {
        "visibility_timeout": seconds,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }


def celery_worker(
    log_path: Path, broker_url: str, redis_url: str, *, name: str = "w1", queue: str = "celery",
    app: str = "tests.support.celery_app", **env: str,
) -> WorkerProcess:  # fmt: skip
    """A Celery prefork worker of two processes of ``app`` consuming ``queue``, not started
    yet."""
    command = [
        sys.executable, "-m", "celery", "-A", app, "worker",
        "--pool", "prefork", "--concurrency", "2", "--loglevel", "INFO",
        "--hostname", f"{name}@%h", "--queues", queue, "--without-gossip", "--without-mingle",
        "--without-heartbeat",
    ]  # fmt: skip
    environment = {
        "DJANGO_REDIS_LOCK_TEST_BROKER_URL": broker_url,
        "DJANGO_REDIS_LOCK_TEST_REDIS_URL": redis_url,
        **env,
    }
    # Logged once it consumes: "w1@<host> ready."
    return WorkerProcess(command, environment, log_path, ready=" ready.")
