"""Single-instance management commands, in-process and as real processes."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redis_lock import AlreadyRunning, Lock
from django_redis_lock.management import lines
from tests.conftest import django_redis_caches
from tests.support.helpers import hold_in_thread
from tests.testapp.management.commands import lose_lock_job, quick_job

ROOT = Path(__file__).resolve().parents[2]


def manage(
    redis_url: str, *args: str, settings: str = "tests.settings", path: str = "", **popen
) -> subprocess.Popen:
    """``python -m django *args`` in a child process on the suite's Redis; ``settings`` and
    ``path`` (a directory to import it from) for settings of a test's own."""
    python_path = os.pathsep.join(filter(None, [str(ROOT), path]))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings, "PYTHONPATH": python_path}
    env["DJANGO_REDIS_LOCK_TEST_REDIS_URL"] = redis_url
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args], env=env, cwd=ROOT, text=True, **popen
    )


@pytest.fixture
def running_holder(redis_url):
    """``hold_job`` running in another process, holding its lock until told to stop."""
    process = manage(redis_url, "hold_job", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdout.readline().strip() == "started"
    yield process
    if process.poll() is None:
        process.kill()
    process.communicate()


# -- across processes ------------------------------------------------------------------------


def test_second_instance_exits_and_names_the_holder(redis_url, running_holder):
    second = manage(redis_url, "hold_job", stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, stderr = second.communicate(timeout=60)
    assert second.returncode == 75
    assert str(running_holder.pid) in stderr
    assert "manage.py hold_job" in stderr  # the label
    assert "since" in stderr
    assert len(stderr.strip().splitlines()) == 1  # one line, no traceback

    running_holder.stdin.write("stop\n")
    running_holder.stdin.flush()
    assert running_holder.wait(30) == 0
    after = Lock("hold_job", wait=0)
    assert after.acquire()  # released on the way out
    after.release()


@pytest.mark.parametrize("wait", ["0", "0.2"])
def test_verbosity_zero_is_silent(redis_url, running_holder, wait):
    """Nothing on stderr, not even through logging's last-resort handler (tests.settings has
    no LOGGING, like many projects): a waited-for lock the command gives up on is the
    command's condition to report, by its exit status."""
    second = manage(
        redis_url, "hold_job", "--verbosity", "0", "--lock-wait", wait,
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    _, stderr = second.communicate(timeout=60)
    assert second.returncode == 75
    assert stderr == ""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_releases_the_lock_before_the_process_ends(redis_url, running_holder, signum):
    running_holder.send_signal(signum)
    running_holder.wait(30)
    assert running_holder.returncode != 0
    # Free at once, not when the lease would have run out.
    assert Lock("hold_job", wait=0).acquire()


def test_run_locked_guards_a_stock_command(redis_url):
    with Lock("run_locked:check", timeout=30):
        blocked = manage(redis_url, "run_locked", "check", stderr=subprocess.PIPE)
        _, stderr = blocked.communicate(timeout=60)
    assert blocked.returncode == 75
    assert "run_locked:check" in stderr
    free = manage(redis_url, "run_locked", "check", "--deploy", stderr=subprocess.PIPE)
    _, stderr = free.communicate(timeout=60)
    assert free.returncode == 0
    assert "security.W001" in stderr  # the command's own arguments passed through


BAD_SETTINGS = {
    "django_redis_lock.E001": 'DJANGO_REDIS_LOCK_CACHE_ALIAS = "no-such-cache"',
    "django_redis_lock.E004": 'DJANGO_REDIS_LOCK_TIMEOUT = "30"',
}


def manage_with(redis_url: str, tmp_path: Path, setting: str, *args: str) -> tuple[int, str]:
    """A command run with the suite's settings and ``setting`` besides: its status, stderr."""
    (tmp_path / "settings_of_this_test.py").write_text(
        f"from tests.settings import *\n{setting}\n"
    )
    process = manage(
        redis_url, *args, settings="settings_of_this_test", path=str(tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = process.communicate(timeout=60)
    assert stdout == ""  # the command did not run
    return process.returncode, stderr


@pytest.mark.parametrize("check", BAD_SETTINGS)
@pytest.mark.parametrize("command", [["quick_job"], ["run_locked", "check"]], ids=" ".join)
def test_a_bad_setting_is_the_system_checks_message_not_a_traceback(
    redis_url, tmp_path, check, command
):
    """The system checks run before the lock is taken, as for any command (``migrate``)."""
    returncode, stderr = manage_with(redis_url, tmp_path, BAD_SETTINGS[check], *command)
    assert returncode == 1
    assert "SystemCheckError: System check identified some issues" in stderr
    assert f"({check})" in stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("check", "named"),
    [
        ("django_redis_lock.E001", "DJANGO_REDIS_LOCK_CACHE_ALIAS"),
        ("django_redis_lock.E004", "DJANGO_REDIS_LOCK_TIMEOUT"),
    ],
)
@pytest.mark.parametrize(
    "command", [["quick_job", "--skip-checks"], ["run_locked", "--skip-checks", "check"]],
    ids=" ".join,
)  # fmt: skip
def test_with_skip_checks_a_bad_setting_is_a_command_error_naming_it(
    redis_url, tmp_path, check, named, command
):
    returncode, stderr = manage_with(redis_url, tmp_path, BAD_SETTINGS[check], *command)
    assert returncode == 1
    [line] = stderr.strip().splitlines()
    assert line.startswith("CommandError: Not running: ")
    assert named in line
    assert line.endswith(f"({check})")


# -- in-process (call_command) -----------------------------------------------------------


def test_call_command_raises_already_running_with_the_configured_code(settings):
    settings.DJANGO_REDIS_LOCK_COMMAND_EXIT_CODE = 0
    release, thread = hold_in_thread("jobs:quick")
    try:
        with pytest.raises(AlreadyRunning) as info:
            call_command("quick_job")
    finally:
        release.set()
        thread.join()
    assert info.value.returncode == 0
    assert info.value.holder.owner["pid"] == os.getpid()


def test_lock_options_exist_even_when_add_arguments_skips_super():
    quick_job.runs.clear()
    call_command("quick_job", "--tag", "a", "--lock-wait", "0", "--lock-timeout", "5")
    assert quick_job.runs == ["a"]


def test_lock_wait_waits_for_the_running_instance():
    quick_job.runs.clear()
    release, thread = hold_in_thread("jobs:quick")
    threading.Timer(0.2, release.set).start()  # the other instance finishes a bit later
    call_command("quick_job", "--tag", "waited", lock_wait=10)
    thread.join()
    assert quick_job.runs == ["waited"]


def test_bad_lock_wait_is_a_command_error():
    with pytest.raises(CommandError, match="lock-wait"):
        call_command("quick_job", "--lock-wait", "-1")


def test_mixin_on_an_existing_command_class():
    release, thread = hold_in_thread("guarded_check")
    try:
        with pytest.raises(AlreadyRunning):
            call_command("guarded_check")
    finally:
        release.set()
        thread.join()
    call_command("guarded_check")  # free again: the stock check runs


def test_lost_lock_aborts_the_command(settings):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    lose_lock_job.progress.clear()
    with pytest.raises(CommandError, match="was lost"):
        # The watchdog looks within 0.1 s; a minute of work leaves a loaded machine's
        # watchdog all the time it needs to find the lease gone first.
        call_command("lose_lock_job", work=60)
    assert lose_lock_job.progress == ["deleted"]  # interrupted in the middle of its work


def test_lost_lock_can_be_let_finish(settings):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    settings.DJANGO_REDIS_LOCK_COMMAND_ON_LOST = "finish"
    lose_lock_job.progress.clear()
    call_command("lose_lock_job")
    assert lose_lock_job.progress == ["deleted", "finished"]


def test_disabled_runs_without_a_lock(settings):
    settings.DJANGO_REDIS_LOCK_ENABLED = False
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")  # Redis not even reachable
    quick_job.runs.clear()
    call_command("quick_job", "--tag", "off")
    assert quick_job.runs == ["off"]


def test_redis_down_fails_closed_by_default(settings):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")
    quick_job.runs.clear()
    with pytest.raises(CommandError, match="Not running"):
        call_command("quick_job")
    assert quick_job.runs == []


def test_redis_down_fail_open_runs_unprotected(settings, caplog):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")
    settings.DJANGO_REDIS_LOCK_FAIL_OPEN = True
    quick_job.runs.clear()
    call_command("quick_job", "--tag", "open")
    assert quick_job.runs == ["open"]
    assert any("without its lock" in record.getMessage() for record in caplog.records)


def test_cli_release_of_a_key_that_is_not_a_lock_deletes_nothing(redis_client, planted):
    redis_client.set("lock:{weird}", "x")
    planted.add("lock:{weird}")
    with pytest.raises(CommandError, match="is not a lock"):
        call_command("redis_locks", "release", "weird", "--token", "some-token")
    assert redis_client.get("lock:{weird}") == b"x"


def test_cli_list_warns_of_a_redis_that_may_evict_lock_keys(settings, redis_server_factory):
    server = redis_server_factory(
        args=["--maxmemory", "50mb", "--maxmemory-policy", "volatile-lru"]
    )
    settings.CACHES = django_redis_caches(server.url)
    with Lock("listed", timeout=10):
        out, err = io.StringIO(), io.StringIO()
        call_command("redis_locks", "list", stdout=out, stderr=err)
    assert "listed" in out.getvalue()
    assert "may evict lock keys" in err.getvalue()
    assert "volatile-lru" in err.getvalue()


def test_cli_list_keeps_a_long_name_and_a_newline_on_one_short_row():
    """A 300-character name with a newline and an escape sequence: one row, cut with an
    ellipsis so that the other columns stay on the terminal; `show` and `--json` have it whole."""
    name = "report:" + "x" * 280 + "\nsecond line\x1b[2J" + "y" * 10
    with Lock(name, timeout=30, label="long one"), Lock("short", timeout=30):
        out, err = io.StringIO(), io.StringIO()
        call_command("redis_locks", "list", stdout=out, stderr=err)
        printed = out.getvalue().splitlines()
        as_json = io.StringIO()
        call_command("redis_locks", "list", "--json", stdout=as_json)
        shown = io.StringIO()
        call_command("redis_locks", "show", name, "--json", stdout=shown)
    assert len(printed) == 3  # the header and one row per lock: the newline split nothing
    long_row = next(line for line in printed if line.startswith("report:"))
    assert "…" in long_row
    assert "\x1b" not in long_row
    assert "long one" in long_row  # the next column is still there, near the start
    assert long_row.index("long one") <= 48 + 2
    assert max(len(line) for line in printed) < 200
    assert "show NAME" in err.getvalue()
    assert name in {lock["name"] for lock in json.loads(as_json.getvalue())}
    assert json.loads(shown.getvalue())["name"] == name


def test_a_cell_escapes_control_characters_and_cuts_at_its_width():
    assert lines.cell("a\nb\tc\x1b") == "a\\nb\\tc\\x1b"
    assert lines.cell("é" * 100) == "é" * 47 + "…"
    assert lines.cell("ok") == "ok"


def test_stats_counts_in_words_that_agree_with_their_numbers(redis_client):
    """``1 key looked at``, not ``1 keys``; held and waiting said per kind, as the admin does."""
    from django_redis_lock import Semaphore
    from django_redis_lock.primitives.keys import lock_keys
    from tests.support.helpers import plant_lease

    def first_line() -> str:
        out = io.StringIO()
        call_command("redis_locks", "stats", stdout=out)
        return out.getvalue().splitlines()[0]

    # One key: a lease another process wrote (a holder here adds its process record).
    lease = lock_keys("one:lock", "default").lease
    plant_lease(redis_client, lease, px=30_000)
    assert first_line() == (
        "1 held (1 lock, 0 permits of 0 semaphores), 0 waiting (0 for locks, 0 for permits); "
        "1 key looked at."
    )
    with Semaphore("one:semaphore", limit=3):
        line = first_line()
    assert line.startswith("2 held (1 lock, 1 permit of 1 semaphore), 0 waiting ")
    assert line.endswith(" keys looked at.")
    redis_client.delete(lease)


def test_counted_says_one_and_many():
    assert [lines.counted(n, "key") for n in (0, 1, 2)] == ["0 keys", "1 key", "2 keys"]
