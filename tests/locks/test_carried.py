"""``backends/inflight.py``'s carried exchanges, at the edge where the event loop itself ends
them: a request carried in a task of its own, cancelled (asyncio.run shutting down) before that
task ever ran. Nothing was sent; the request's coroutine is closed, not left to the garbage
collector's "coroutine ... was never awaited" warning in the user's log."""

from __future__ import annotations

import asyncio
import gc
import warnings

from django_redis_lock.backends.inflight import carry


def test_an_exchange_whose_task_never_ran_is_closed_without_a_warning():
    started = []

    async def exchange() -> str:
        started.append(True)
        return "reply"

    async def main() -> None:
        carrying = asyncio.create_task(carry(exchange()))
        await asyncio.sleep(0)  # carry() runs: its exchange's task is made, not yet run
        [inner] = asyncio.all_tasks() - {asyncio.current_task(), carrying}
        inner.cancel()  # as asyncio.run's shutdown cancels every task left
        done = await carrying
        assert done.error is not None  # no reply: the exchange never ran

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    assert not started
    assert not [w for w in caught if "never awaited" in str(w.message)]
