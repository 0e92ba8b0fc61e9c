"""The machine and the run: what the results' machine section says (CPU, versions, the commit),
git, the progress log on stderr, and the package as it was at another commit.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]  # the work tree


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def library_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def describe_machine(admin: redis.Redis) -> dict[str, str]:
    server = admin.info("server")
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", "django_redis_lock"):
        commit += " + uncommitted changes in django_redis_lock/"
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    libraries = ", ".join(
        f"{name} {library_version(name)}"
        for name in (
            "django-redis-lock",
            "Django",
            "redis",
            "django-redis",
            "python-redis-lock",
            "pottery",
            "redis-fifo-lock",
            "psycopg",
            # Installed, it parses every redis-py client's replies (every library's).
            "hiredis",
        )
    )
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "CPU": cpu_model(),
        "cores": str(os.cpu_count()),
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "redis-server": f"{server['redis_version']} (private, embedded, loopback TCP)",
        "libraries": libraries,
        "django-redis-lock commit": commit,
        "load average at start": load,
    }


def log(message: str) -> None:
    """A progress line on stderr, timed."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def worktree_at(ref: str) -> Iterator[Path]:
    """The package as it was at git ``ref``: a temporary worktree, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-before-") as directory:
        path = Path(directory) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref],
            check=True, capture_output=True,
        )  # fmt: skip
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                check=False, capture_output=True,
            )  # fmt: skip
