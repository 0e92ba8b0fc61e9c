"""Locks over TLS (``rediss://``): a TLS-only redis-server with a throw-away certificate
(``trustme``), reached through django-redis and through Django's own Redis cache, sync and
async: taking, waiting (the handoff's blocking read on a TLS socket), renewal, and the admin."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import trustme

from dev.embedded_redis import EmbeddedRedis, RedisServerNotFound, TlsFiles
from django_redis_lock import Lock, LockBackendError, get_redis_client
from django_redis_lock.primitives.keys import lock_keys
from tests.support import promises
from tests.support.helpers import lease_token

CACHE_BACKENDS = {
    "django-redis": "django_redis.cache.RedisCache",
    "django": "django.core.cache.backends.redis.RedisCache",
}


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A redis-server that speaks TLS only, its certificate signed by a throw-away CA."""
    directory = tmp_path_factory.mktemp("tls")
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    files = TlsFiles(*(str(directory / name) for name in ("cert.pem", "key.pem", "ca.pem")))
    certificate.cert_chain_pems[0].write_to_path(files.cert)
    certificate.private_key_pem.write_to_path(files.key)
    authority.cert_pem.write_to_path(files.ca)
    try:
        server = EmbeddedRedis(tls=files, directory=directory / "data")
    except RedisServerNotFound as exc:
        pytest.skip(str(exc))
    server.start()
    yield server
    server.stop()


def _caches(
    server: EmbeddedRedis, backend: str, location: str | None = None, **tls: Any
) -> dict[str, Any]:
    options = {"CONNECTION_POOL_KWARGS": tls} if backend == "django-redis" else tls
    return {
        "default": {
            "BACKEND": CACHE_BACKENDS[backend],
            "LOCATION": location or server.url,
            "OPTIONS": options,
        }
    }


@pytest.fixture(params=sorted(CACHE_BACKENDS))
def over_tls(request: Any, settings: Any, tls_server: EmbeddedRedis) -> Iterator[SimpleNamespace]:
    """The default cache (and so the locks) on the TLS server, through each cache backend."""
    assert tls_server.tls is not None
    settings.CACHES = _caches(tls_server, request.param, ssl_ca_certs=tls_server.tls.ca)
    client = redis.Redis.from_url(tls_server.url, ssl_ca_certs=tls_server.tls.ca)
    client.flushdb()
    yield SimpleNamespace(client=client, server=tls_server)
    client.close()


def test_the_server_speaks_tls_only(tls_server):
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host=tls_server.host, port=tls_server.port, socket_timeout=2).ping()


def test_locks_take_over_tls(over_tls):
    connection = get_redis_client().connection_pool.get_connection()
    try:
        assert isinstance(connection._sock, ssl.SSLSocket)  # not a plain socket
    finally:
        get_redis_client().connection_pool.release(connection)
    with Lock("tls:basic", timeout=10, fencing=True) as held:
        assert lease_token(over_tls.client, lock_keys("tls:basic", "default").lease) == held.token
        assert held.owned()
        assert held.fencing_token
        assert not Lock("tls:basic", wait=0).acquire()
    assert not over_tls.client.exists(lock_keys("tls:basic", "default").lease)


def test_a_waiter_is_handed_the_lock_over_tls(over_tls):
    # Woken by the release's push, read off a TLS socket.
    queue = lock_keys("tls:wait", "default").queue
    promises.a_waiter_gets_the_lock_after_the_release(
        "tls:wait", in_line=lambda: over_tls.client.llen(queue) == 1
    )


def test_renewed_over_tls_and_a_loss_is_told(over_tls, settings):
    key = lock_keys("tls:renew", "default").lease
    promises.renewed_while_held_and_a_loss_is_told(
        "tls:renew", settings, lambda: over_tls.client.get(key),
        lambda: over_tls.client.delete(key),
    )  # fmt: skip


def test_the_async_api_over_tls(over_tls):
    promises.the_async_api_waits_without_blocking_the_loop("tls:async")


def test_the_admin_lists_and_releases_over_tls(over_tls, admin_client):
    with Lock("tls:listed", timeout=30, label="over TLS") as held:
        page = admin_client.get("/admin/django_redis_lock/heldlock/")
        assert page.status_code == 200
        assert "tls:listed" in page.content.decode()
        assert "over TLS" in page.content.decode()
        assert held.owned()


def test_an_untrusted_certificate_is_a_clear_backend_error(settings, tls_server):
    """Without the CA, the client refuses the server: the error says so (and the suite's other
    tests would fail the same way if the TLS options did not reach the connection)."""
    # Another database: django-redis keeps one pool per URL for the process, and the other
    # tests' pool trusts the CA.
    settings.CACHES = _caches(tls_server, "django-redis", tls_server.url.replace("/0", "/1"))
    with pytest.raises(LockBackendError, match=r"certificate verify failed"):
        Lock("tls:untrusted", wait=0).acquire()


def test_certificates_are_written_where_the_server_reads_them(tls_server):
    assert tls_server.tls is not None
    for path in (tls_server.tls.cert, tls_server.tls.key, tls_server.tls.ca):
        assert Path(path).read_text().startswith("-----BEGIN")
