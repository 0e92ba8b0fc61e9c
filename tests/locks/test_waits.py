"""``backends/waits.py``: how long a blocked wait gives Redis to answer. A block whose time
matters to the millisecond is cut by the client; otherwise Redis' own timeout is used, which an
idle server checks only at its next timer tick (100 ms with the default ``hz``), so the client
allows it some lateness: 0.5 s, a short block less, down to 20 ms (a ``fair=False`` waiter that
lost the race asks again within a few ms: an idle server must not make that 100 ms)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from django_redis_lock.backends.waits import wait_for_wake


class RecordingConnection(redis.Connection):
    """A real connection that notes how long each wait for a reply may last (the pool's own
    checks for unread data, which do not wait, aside)."""

    waits: list[float] = []  # (one test at a time reads it)

    def can_read(self, timeout: float | None = 0) -> bool:
        if timeout:
            RecordingConnection.waits.append(timeout)
        return super().can_read(timeout)


@pytest.fixture
def recording(redis_url: str) -> Any:
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=RecordingConnection)
    RecordingConnection.waits = []
    yield redis.Redis(connection_pool=pool)
    pool.disconnect()


@pytest.mark.parametrize(
    ("seconds", "exact", "client_waits"),
    [
        (2.0, False, 2.5),  # the server's timer, and 0.5 s of lateness
        (0.1, False, 0.2),  # a short block: as much lateness as it lasts
        (0.005, False, 0.025),  # never less than 20 ms of it
        (0.005, True, 0.005),  # cut by the client to the millisecond
    ],
)
def test_a_block_gives_the_server_lateness_by_its_length(
    recording: Any, seconds: float, exact: bool, client_waits: float
) -> None:
    recording.rpush("wake-me", "message")  # (answered at once: nothing waits for a timer)
    assert wait_for_wake(recording, "wake-me", seconds, exact=exact) == b"message"
    assert RecordingConnection.waits == [pytest.approx(client_waits)]
