"""The scripts' clock, driven by the test: where server time is the logic under test.

A script loaded by :meth:`DrivenClock.script` asks ``server_time()`` (``scripts.SERVER_TIME``,
the one part of a script the simulation replaces too) and gets the time the test set, not the
server's ``TIME``. So between two steps of a test no server time passes but what the test moves
(``advance``), however loaded the machine: a mark 5 ms ahead is still ahead at the next step,
and a lease handed "until the waiter's deadline" is exactly that many milliseconds long.

The keys' expiries stay Redis's own, on its real clock: a test on this clock asserts the
lengths the scripts set (``PX``, the replies), not how long keys last. One server only (the
clock is one key, outside the scripts' ``KEYS``), through the tests' own client.
"""

from __future__ import annotations

import functools
from typing import Any

from django_redis_lock.backends.scripts import Script, load_script

__all__ = ["CLOCK_KEY", "DrivenClock"]

CLOCK_KEY = "drl-test:server-clock"

_DRIVEN_TIME = f"""
local function server_time()
  local micros = tonumber(redis.call('GET', '{CLOCK_KEY}'))
  if not micros then error('the driven server clock ({CLOCK_KEY}) is not set') end
  return math.floor(micros / 1000), micros
end"""


@functools.cache
def _driven(name: str) -> Script:
    return load_script(name, server_time=_DRIVEN_TIME)


class DrivenClock:
    """The server time the driven scripts see, in ms; it starts at the server's own now."""

    def __init__(self, client: Any) -> None:
        self.client = client
        seconds, micros = client.time()
        self.now_ms = int(seconds) * 1000 + int(micros) // 1000
        self._write()

    def advance(self, ms: int) -> int:
        """Move the clock ``ms`` on; returns the new now."""
        self.now_ms += ms
        self._write()
        return self.now_ms

    def script(self, name: str) -> Script:
        """The engine's ``lua/<name>.lua`` on this clock."""
        return _driven(name)

    def _write(self) -> None:
        self.client.set(CLOCK_KEY, self.now_ms * 1000, px=3_600_000)
