"""The example project, run the way ``make demo`` runs it: a real server, a real Redis."""

from __future__ import annotations

import http.cookiejar
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from tests.helpers import free_port, port_is_open, wait_for_exit

EXAMPLE = Path(__file__).resolve().parent.parent / "example_project"


def demo_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update(DEMO_DATABASE=str(tmp_path / "db.sqlite3"), PYTHONUNBUFFERED="1", **extra)
    return env


class Demo:
    """``demo.py`` in a subprocess, its output read line by line as it comes."""

    def __init__(self, tmp_path: Path, *args: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.process = subprocess.Popen(
            [sys.executable, str(EXAMPLE / "demo.py"), "--addr", f"127.0.0.1:{self.port}",
             "--redis-dir", str(tmp_path / "redis"), *args],
            env=demo_env(tmp_path, **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for_line(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if match := re.search(pattern, line):
                return match
        raise AssertionError(f"no line matching {pattern!r}; output:\n{''.join(self.output)}")

    def get(self, path: str = "", timeout: float = 30) -> tuple[int, str]:
        # runserver prints its banner just before binding: retry refused connections briefly.
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + path, timeout=10) as response:
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()
            except urllib.error.URLError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.1)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        code = self.process.wait(timeout=30)
        self._reader.join(timeout=10)  # all output read before anyone looks at it
        self.process.stdout.close()  # type: ignore[union-attr]
        return code


@pytest.fixture
def run_demo(tmp_path):
    demos: list[Demo] = []

    def start(*args: str, **env: str) -> Demo:
        demos.append(Demo(tmp_path, *args, **env))
        return demos[-1]

    yield start
    for demo in demos:
        demo.stop()


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_demo_with_embedded_redis_serves_home_and_cleans_up(run_demo, stop_signal):
    demo = run_demo()
    match = demo.wait_for_line(r"embedded redis-server (\S+) on (\S+) \(pid (\d+)\)")
    binary, redis_url, redis_pid = match.group(1), match.group(2), int(match.group(3))
    demo.wait_for_line(r"serving http://")

    status, page = demo.get()
    assert status == 200
    assert 'id="redis-status">connected' in page
    server = redis.Redis.from_url(redis_url)
    version = server.info("server")["redis_version"]
    server.close()
    assert f'id="redis-version">{version}<' in page
    assert f'id="redis-address">127.0.0.1:{redis_url.rsplit(":", 1)[1].split("/")[0]}/0<' in page
    assert binary in page  # says which binary is the embedded server

    assert demo.stop(stop_signal) == 0
    assert "embedded redis-server stopped" in "".join(demo.output)
    assert wait_for_exit(redis_pid, timeout=10), "the embedded redis-server outlived the demo"
    assert not port_is_open("127.0.0.1", demo.port), (
        "runserver (or its reloader child) outlived the demo"
    )


def test_the_commands_the_demo_prints_work_verbatim(run_demo, tmp_path):
    """What the demo says to run in another terminal runs there as printed (no REDIS_URL in
    that terminal) and uses the demo's Redis: two send_invoices at once, one refused."""
    demo = run_demo("--noreload")
    redis_url = demo.wait_for_line(r"embedded redis-server \S+ on (\S+)").group(1)
    manage = demo.wait_for_line(r"in another terminal, try:  (.+) buy_last_items").group(1)
    terminal = {**demo_env(tmp_path), "PATH": os.environ["PATH"]}
    root = EXAMPLE.parent
    with subprocess.Popen(
        f"{manage} send_invoices --seconds 20", shell=True, cwd=root, env=terminal,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    ) as first:  # fmt: skip
        try:
            line = first.stdout.readline()
            assert "Sending invoices" in line, first.stderr.read()
            again = re.search(r"run `(.+)` in another terminal", line).group(1)
            server = redis.Redis.from_url(redis_url)
            assert any(b"send_invoices" in key for key in server.scan_iter("demo:*"))
            server.close()
            second = subprocess.run(
                f"{again} --seconds 0", shell=True, cwd=root, env=terminal,
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        finally:
            os.killpg(first.pid, signal.SIGTERM)
            first.communicate(timeout=30)
    assert second.returncode == 75, second.stderr
    assert "Not running: another instance holds the lock" in second.stderr


def test_demo_uses_redis_url_when_given(run_demo, redis_url):
    demo = run_demo("--noreload", REDIS_URL=redis_url)
    demo.wait_for_line(r"using REDIS_URL=")
    status, page = demo.get()
    assert status == 200
    assert "<code>REDIS_URL</code> was given" in page
    port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"]
    assert f":{port}/" in page
    assert "embedded redis-server" not in "".join(demo.output)


def test_home_page_reports_an_unreachable_redis(run_demo):
    demo = run_demo("--noreload", REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    demo.wait_for_line(r"serving http://")
    status, page = demo.get()
    assert status == 503
    assert "unreachable" in page


def test_example_project_passes_its_checks(tmp_path, redis_url):
    result = subprocess.run(
        [sys.executable, str(EXAMPLE / "manage.py"), "check", "--fail-level", "WARNING"],
        env=demo_env(tmp_path, REDIS_URL=redis_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def example_manage(tmp_path, redis_url, *args, **popen):
    env = demo_env(tmp_path, REDIS_URL=redis_url)
    return subprocess.run(
        [sys.executable, str(EXAMPLE / "manage.py"), *args],
        env=env, capture_output=True, text=True, timeout=300, cwd=EXAMPLE, **popen,
    )  # fmt: skip


@pytest.fixture
def migrated(tmp_path, redis_url):
    result = example_manage(tmp_path, redis_url, "migrate", "--noinput")
    assert result.returncode == 0, result.stderr
    return tmp_path


def test_buying_the_last_items_from_several_processes_oversells_nothing(migrated, redis_url):
    result = example_manage(
        migrated, redis_url, "buy_last_items", "--processes", "4", "--stock", "12"
    )
    assert result.returncode == 0, result.stderr
    assert "left: 0, orders: 12" in result.stdout
    assert "oversold: 0" in result.stdout
    assert re.search(r"\d+ of the 16 purchase attempts waited", result.stdout)


def test_send_invoices_runs_once_at_a_time(migrated, redis_url):
    env = demo_env(migrated, REDIS_URL=redis_url)
    command = [sys.executable, str(EXAMPLE / "manage.py"), "send_invoices", "--seconds", "20"]
    with subprocess.Popen(
        command, env=env, cwd=EXAMPLE, stdout=subprocess.PIPE, text=True
    ) as first:
        assert "Sending invoices" in first.stdout.readline()
        second = example_manage(migrated, redis_url, "send_invoices", "--seconds", "0")
        first.terminate()
        first.communicate(timeout=30)
    assert second.returncode == 75
    assert str(first.pid) in second.stderr


def test_demo_double_click_makes_one_order(run_demo):
    demo = run_demo("--noreload")
    demo.wait_for_line(r"serving http://")
    assert demo.get("shop/")[0] == 200  # up
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(demo.url + "shop/", timeout=30).read().decode()  # and the CSRF cookie
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    product = re.search(r'name="product" value="(\d+)"', page).group(1)
    body = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": token, "product": product, "quantity": 1}
    ).encode()

    def order():
        request = urllib.request.Request(
            demo.url + "shop/checkout/", body,
            headers={"Accept": "application/json", "Referer": demo.url + "shop/"},
        )  # fmt: skip
        try:
            with opener.open(request, timeout=30) as response:
                return response.status, response.headers.get("Idempotent-Replayed")
        except urllib.error.HTTPError as error:
            return error.code, None

    with ThreadPoolExecutor(2) as pool:
        statuses = sorted(status for status, _ in pool.map(lambda _: order(), range(2)))
    assert statuses == [201, 409]
    assert order() == (201, "true")  # this browser's session: its first response, replayed
    _, page = demo.get("shop/")
    assert 'id="order-count">1<' in page
