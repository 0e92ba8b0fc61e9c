"""Small helpers shared by the tests."""

import os
import select
import shutil
import socket
import threading
import urllib.parse
from typing import Any

from django_redis_lock import Lock
from django_redis_lock.backends.acl import OPTIONAL_COMMANDS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) == 0


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Block until process ``pid`` (not necessarily our child) has exited; False on timeout."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie that nobody reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return "\nState:\tZ" not in status.read()
    except FileNotFoundError:
        return False


def acquire_then_release(primitive: Any) -> bool:
    """A waiter for a thread of its own that leaves nothing held behind it: a lock left held by
    an ended thread warns, when the collector finds it, inside whatever test runs then."""
    acquired = bool(primitive.acquire())
    if acquired:
        primitive.release()
    return acquired


def wait_until(predicate, timeout: float = 10.0, what: str = "condition", interval: float = 0.01):
    """Poll ``predicate`` until it returns something true, for at most ``timeout`` seconds;
    returns that value, or fails the test saying ``what`` never happened."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def keys_without_ttl(client, exempt=()) -> list:
    """Keys of ours (our layout puts a ``{hash tag}`` in every key) that have no expiry,
    other than those in ``exempt`` (planted by the test itself)."""
    exempt = {key.encode() if isinstance(key, str) else key for key in exempt}
    return sorted(
        key
        for key in client.scan_iter(match="*{*}*", count=1000)
        if key not in exempt and client.pttl(key) == -1
    )


def run_async(coroutine):
    """asyncio.run, closing our connections before the loop goes away."""
    import asyncio

    from django_redis_lock import aclose_async_redis_clients

    async def main():
        try:
            return await coroutine
        finally:
            await aclose_async_redis_clients()

    return asyncio.run(main())


def read_lease(client, key):
    """The lease stored at ``key``, decoded (None when there is none)."""
    from django_redis_lock.core.lease import decode_lease

    value = client.get(key)
    return None if value is None else decode_lease(value)


def lease_token(client, key):
    """The token of the lease stored at ``key`` (None when there is none)."""
    lease = read_lease(client, key)
    return None if lease is None else lease.token


def plant_lease(client, key, token="someone-else", px=None):
    """Write a lease of another holder at ``key``, as that holder's acquisition would."""
    from django_redis_lock.core.lease import OwnerRecord, encode_lease

    value = encode_lease(token, 1, 0, OwnerRecord(10, 1, "elsewhere", "MainThread").encode())
    client.set(key, value, px=px)


def start_queued(count: int, target, client, queue_key, timeout: float = 10.0) -> list:
    """Start ``count`` threads running ``target(index)``, each once the one before has joined
    the queue at ``queue_key`` (so they queue in index order); returns the threads."""
    import threading

    threads = []
    for index in range(count):
        thread = threading.Thread(target=target, args=(index,))
        thread.start()
        threads.append(thread)
        wait_until(lambda i=index: client.llen(queue_key) == i + 1, timeout, "queued")
    return threads


def staff(*permissions: str):
    """A logged-in test client of a staff user with these permissions (codenames)."""
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    user = User.objects.create_user(f"staff-{len(permissions)}", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def django_redis_caches(url: str, **options: Any) -> dict[str, Any]:
    """A CACHES setting with one django-redis cache at ``url``."""
    return {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": options,
        }
    }


def as_user(url: str, user: str, password: str) -> str:
    """``url`` (a server's), logging in as the Redis ACL user ``user``."""
    parts = urllib.parse.urlsplit(url)
    return parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}").geturl()


def make_acl_user(client: Any, user: str, password: str, rule: str) -> None:
    """The Redis ACL user ``user`` (made anew) with ``password`` and ``rule`` (``acl_rule()``),
    on ``client``'s server, whose ACL log is emptied for :func:`refused_by_acl`."""
    client.execute_command("ACL", "SETUSER", user, "reset", "on", f">{password}", *rule.split())
    client.execute_command("ACL", "LOG", "RESET")


def refused_by_acl(client: Any) -> list[str]:
    """What the server's ACL log shows refused, but what the locks' rule leaves out on purpose
    (``OPTIONAL_COMMANDS``: redis-py's CLIENT SETINFO).
    Redis 6.2 logs a refused subcommand as its container (``client``), later servers as
    ``client|setinfo``."""
    optional = {command.lower() for command in OPTIONAL_COMMANDS}
    optional |= {command.split("|", 1)[0] for command in optional}
    return [entry["object"] for entry in client.acl_log() if entry["object"] not in optional]


# Headless Chromium (Debian's: Playwright never downloads one here), for the browser tests.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def find_chromium() -> str | None:
    configured = os.environ.get("CHROMIUM")
    if configured:
        return configured
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def keys_left(client, pattern: str = "*") -> list:
    """The keys matching ``pattern``, but for the processes' records (``{!process}``, kept an
    hour whether a lock is held or not: core/dead_holders.py): what locks left behind."""
    return [key for key in client.keys(pattern) if b"{!process}" not in key]


def hold_in_thread(name: str, timeout: float = 30) -> tuple[threading.Event, threading.Thread]:
    """Hold ``Lock(name, timeout=timeout)`` in another thread until the returned event is set
    (30 s at most); returns once it is held."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with Lock(name, timeout=timeout):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    return release, thread


# A lease the watchdog keeps alive on a loaded machine: renewed a third of the way, it is lost
# only if the watchdog's thread gets no turn for two thirds of it (1.3 s). Sub-second leases
# (0.3 s: 0.2 s without a turn) were lost on a 2-core machine with both cores busy.
RENEWED_LEASE = 2.0


def renewed_after(held: Any, moment: float, timeout: float = 30) -> None:
    """Wait until the watchdog had ``held``'s lease (a Lock's or a Semaphore's) renewed after
    ``moment`` (monotonic): Redis confirmed it still ours then. With ``moment`` past the end
    of a lease the test knows of (taken, or on a server since replaced), that shows the
    renewals kept it alive all along, by the order of events, however loaded the machine."""
    hold = held._book.hold()
    wait_until(lambda: hold.renewal is not None, timeout, "the watchdog to take the hold on")
    renewal = hold.renewal
    # A renewal confirmed at ``at`` makes it end at ``at`` plus its whole lease.
    wait_until(
        lambda: renewal.expires_at - renewal.lease > moment, timeout, "a renewal after that"
    )
