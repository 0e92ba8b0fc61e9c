"""The private servers of a run, each started for it and stopped after it, by its pid: a
``redis-server`` or ``valkey-server`` (``EmbeddedRedis``: loopback, a free port, no persistence)
and a throw-away PostgreSQL cluster (``private_postgres``).

The repository's ``dev/embedded_redis.py`` is imported here and nowhere else in the benchmarks: the
scripts take ``EmbeddedRedis`` and the rest from this module.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dev import embedded_redis

EmbeddedRedis = embedded_redis.EmbeddedRedis
RedisServerNotFound = embedded_redis.RedisServerNotFound
find_valkey_server = embedded_redis.find_valkey_server
start_cluster = embedded_redis.start_cluster


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A private redis-server for the block; yields its URL."""
    server = EmbeddedRedis().start()
    try:
        yield server.url
    finally:
        server.stop()


# -- PostgreSQL: the advisory locks' server ------------------------------------------------

POSTGRES_START_TIMEOUT = 30.0  # seconds for the new cluster to accept connections
POSTGRES_STOP_TIMEOUT = 10.0


class PostgresUnavailable(RuntimeError):
    """No throw-away PostgreSQL cluster here, and why (its variant shows as n/a with it)."""


def _postgres_version(bindir: Path) -> tuple[int, ...]:
    """(15,) for /usr/lib/postgresql/15/bin."""
    return tuple(int(part) for part in bindir.parent.name.split(".") if part.isdigit())


def postgres_bindir() -> Path:
    """Where ``initdb`` and ``postgres`` are: ``pg_config --bindir``, else the newest
    ``/usr/lib/postgresql/<version>/bin`` (Debian keeps the server's binaries off PATH)."""
    candidates = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        found = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10, check=True
        )
        candidates.append(Path(found.stdout.strip()))
    installed = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(installed, key=_postgres_version, reverse=True)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, postgres) in `pg_config --bindir` or "
        "/usr/lib/postgresql/*/bin"
    )


def _postgres_account(directory: Path) -> dict[str, Any]:
    """``subprocess`` options for initdb and postgres, which refuse to run as root: as root,
    they run as the ``postgres`` system user, and ``directory`` becomes its."""
    if os.geteuid() != 0:
        return {}
    try:
        account = pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable(
            "running as root, with no `postgres` user to run it as"
        ) from None
    os.chown(directory, account.pw_uid, account.pw_gid)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _tail(text: str, lines: int = 3) -> str:
    return " / ".join(text.strip().splitlines()[-lines:])


def _initdb(bindir: Path, data: Path, account: dict[str, Any]) -> None:
    command = [
        str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "bench",
        "--no-sync", "-E", "UTF8", "--locale=C",
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, cwd=data.parent, capture_output=True, text=True, timeout=120, **account
        )
    except subprocess.TimeoutExpired:
        raise PostgresUnavailable("initdb did not finish within 120 s") from None
    if done.returncode != 0:
        raise PostgresUnavailable(f"initdb failed: {_tail(done.stderr)}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn_postgres(
    bindir: Path, data: Path, log: Path, account: dict[str, Any]
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``postgres`` on a free loopback port, its socket in the cluster's directory (so
    never the machine's service); returns the process and the DSN."""
    port = _free_port()
    command = [
        str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(data.parent),
        "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=100",
    ]  # fmt: skip
    with log.open("ab") as output:
        process = subprocess.Popen(
            command, cwd=data.parent, stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=embedded_redis.die_with_parent,
            **account,
        )  # fmt: skip
    return process, f"host=127.0.0.1 port={port} user=bench dbname=postgres"


def _wait_for_postgres(process: subprocess.Popen[bytes], dsn: str, log: Path) -> str:
    """Once the server accepts a connection, its version; PostgresUnavailable if it exits or
    does not within POSTGRES_START_TIMEOUT."""
    import psycopg

    deadline = time.monotonic() + POSTGRES_START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = log.read_text(errors="replace") if log.exists() else ""
            raise PostgresUnavailable(f"postgres exited ({process.returncode}): {_tail(output)}")
        try:
            with psycopg.connect(dsn, connect_timeout=1) as connection:
                return connection.info.parameter_status("server_version") or "?"
        except psycopg.OperationalError:
            time.sleep(0.05)
    raise PostgresUnavailable(
        f"postgres did not accept connections in {POSTGRES_START_TIMEOUT:g} s"
    )


def _stop_postgres(process: subprocess.Popen[bytes]) -> None:
    """Fast shutdown (SIGINT: sessions ended, no waiting for clients), by its pid."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=POSTGRES_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def private_postgres() -> Iterator[tuple[str, str]]:
    """A throw-away PostgreSQL cluster, as ``private_redis`` is a throw-away redis-server:
    ``initdb`` into a temporary directory, ``postgres`` on loopback; yields (DSN, version), then
    stops it and removes the directory. Raises PostgresUnavailable when it cannot start."""
    bindir = postgres_bindir()
    directory = Path(tempfile.mkdtemp(prefix="django-redis-lock-postgres-"))
    process = None
    try:
        account = _postgres_account(directory)
        data, log = directory / "data", directory / "postgres.log"
        _initdb(bindir, data, account)
        process, dsn = _spawn_postgres(bindir, data, log, account)
        yield dsn, _wait_for_postgres(process, dsn, log)
    finally:
        if process is not None:
            _stop_postgres(process)
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """``os.environ[name]`` is ``value`` for the block, and as it was after it."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
