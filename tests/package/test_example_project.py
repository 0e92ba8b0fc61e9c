"""The example project, run the way ``make demo`` runs it: a real server, a real Redis."""

from __future__ import annotations

import http.cookiejar
import os
import queue
import re
import signal
import socket
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

from tests.support.helpers import (
    CHROMIUM_FLAGS,
    find_chromium,
    free_port,
    port_is_open,
    wait_for_exit,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "example_project"


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


@pytest.mark.parametrize(
    "stop_signal",
    [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
    ids=["ctrl-c", "sigterm", "terminal-closed"],
)
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
        answers = list(pool.map(lambda _: order(), range(2)))
    # This browser's session is one person: the duplicate waits for the first, and is shown
    # its response, replayed (both arrive within the view's 0.5 s, so it cannot have run).
    assert sorted(answers, key=lambda answer: answer[1] or "") == [(201, None), (201, "true")]
    assert order() == (201, "true")  # and just after it
    _, page = demo.get("shop/")
    assert 'id="order-count">1<' in page


ROOT = EXAMPLE.parent


def test_make_demo_refuses_a_busy_port_before_it_starts_anything(tmp_path):
    """The real ``make demo`` (its venv stamp taken as it is: this interpreter's venv), on a
    port something listens on: one line that says which port to use instead, no Redis started,
    no "serving"."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            ["make", "--no-print-directory", "-o", ".venv/.installed-demo", "demo",
             f"PORT={port}", f"BIN={Path(sys.executable).parent}"],
            cwd=ROOT, env=demo_env(tmp_path), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode != 0
    suggested = re.search(rf"demo: port {port} is busy: make demo PORT=(\d+)", done.stderr)
    assert suggested, done.stderr
    assert int(suggested.group(1)) != port
    assert "serving" not in done.stdout
    assert "embedded redis-server" not in done.stdout


class Visitor:
    """A browser's requests without a browser: cookies kept, the CSRF token sent back."""

    def __init__(self, demo: Demo) -> None:
        self.demo, self.jar = demo, http.cookiejar.CookieJar()
        handler = urllib.request.HTTPCookieProcessor(self.jar)
        self.opener = urllib.request.build_opener(handler)

    def get(self, path: str) -> str:
        with self.opener.open(self.demo.url + path, timeout=60) as response:
            return response.read().decode()

    def post(self, path: str, **data: str) -> tuple[str, str]:
        """The page a form's POST ends on (redirects followed), and its URL."""
        token = next(cookie.value for cookie in self.jar if cookie.name == "csrftoken")
        body = urllib.parse.urlencode({"csrfmiddlewaretoken": token, **data}).encode()
        request = urllib.request.Request(
            self.demo.url + path, body, headers={"Referer": self.demo.url}
        )
        with self.opener.open(request, timeout=60) as response:
            return response.read().decode(), response.url


def test_the_home_page_makes_contention_to_look_at(run_demo):
    demo = run_demo("--noreload")
    demo.wait_for_line(r"serving http://")
    visitor = Visitor(demo)
    visitor.get("")  # (the CSRF cookie)
    page, url = visitor.post("contention/")
    assert url.endswith("/?contention=started")
    assert 'id="contention">Started' in page
    assert visitor.post("contention/")[1].endswith("/?contention=running")  # one at a time

    visitor.get("admin/login/")
    visitor.post("admin/login/", username="demo", password="demo", next="/admin/")
    locks = visitor.get("admin/django_redis_lock/heldlock/")
    row = re.search(r"report:nightly.*?</tr>", locks, re.S).group(0)
    waiters = [int(n) for n in re.findall(r"<td[^>]*>(\d+)</td>", row)]
    assert waiters, row
    assert waiters[0] >= 1, row  # a holder, and workers queued behind it
    assert "exports" in locks  # the semaphore's permits
    hot = visitor.get("admin/django_redis_lock/heldlock/hot/")
    assert "report:nightly" in hot.split("Most waiters now", 1)[1]

    # A request that waits its turn among the workers, shown by the Debug Toolbar.
    report = visitor.get("report/")
    assert 'id="outcome">built<' in report
    assert 'id="djdt-LocksPanel"' in report


def test_the_shop_restocks_and_keeps_its_own_product(run_demo, tmp_path):
    demo = run_demo("--noreload")
    redis_url = demo.wait_for_line(r"embedded redis-server \S+ on (\S+)").group(1)
    demo.wait_for_line(r"serving http://")
    # buy_last_items first, as the demo suggests: it sells a product of its own out, which
    # must not become the shop's (it did: the shop showed the first product, sold out).
    sale = example_manage(
        tmp_path, redis_url, "buy_last_items", "--processes", "2", "--stock", "2"
    )
    assert "left: 0" in sale.stdout, sale.stderr
    visitor = Visitor(demo)
    shop = visitor.get("shop/")
    assert "Django mug" in shop
    assert 'id="stock">100<' in shop
    product = re.search(r'name="product" value="(\d+)"', shop).group(1)
    visitor.post("shop/checkout/", product=product, quantity="100")  # sold out
    assert 'id="stock">0<' in visitor.get("shop/")
    page, url = visitor.post("shop/restock/")
    assert url.endswith("/shop/?restocked=1")
    assert 'id="restocked">Restocked: 100 in stock.<' in page
    assert 'id="stock">100<' in page


def test_the_double_click_says_what_happened(run_demo, tmp_path):
    """In Chromium: the shop's "Double click" button's text follows the answers: sold out, no
    order; after a restock, one order and the duplicate refused or replayed."""
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("No Chromium found: `apt install chromium`, or set CHROMIUM=/path/to/it.")
    playwright_api = pytest.importorskip("playwright.sync_api")
    demo = run_demo("--noreload")
    demo.wait_for_line(r"serving http://")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.goto(demo.url + "shop/")
            product = page.get_attribute('input[name="product"]', "value")
            page.evaluate(  # this browser buys the whole stock
                """async (product) => {
                    const form = new FormData(document.getElementById("checkout"));
                    form.set("quantity", "100");
                    await fetch("/shop/checkout/", {method: "POST", body: form});
                }""",
                product,
            )
            page.goto(demo.url + "shop/")
            assert page.inner_text("#stock") == "0"
            page.click("#double-click")
            page.wait_for_function("!document.getElementById('result').textContent.includes('…')")
            assert "No order was made: the mug is sold out." in page.inner_text("#result")
            page.screenshot(path=str(tmp_path / "sold-out.png"))

            page.click("#restock")
            page.wait_for_selector("#restocked")
            # Another order than the sold-out pair's (whose answer is replayed for 5 s to the
            # same submission): two of this one.
            page.evaluate("document.querySelector('#checkout [name=quantity]').value = '2'")
            page.click("#double-click")
            page.wait_for_function("!document.getElementById('result').textContent.includes('…')")
            text = page.inner_text("#result")
            assert re.search(r"One order was made \(#\d+\): the duplicate got", text), text
            page.screenshot(path=str(tmp_path / "one-order.png"))
        finally:
            browser.close()
