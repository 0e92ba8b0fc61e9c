"""What the home page's "Make contention" button starts: for about a minute, worker threads
take the nightly report's lock and the exports semaphore in turns, so that there is always a
holder and a queue of waiters to look at in the admin's Locks and Hot locks pages (and, for a
request of yours that waits among them, in the Debug Toolbar's Locks panel).

It runs in the web server's process, on the demo's Redis; one run at a time (a lock of its own
says whether one is under way)."""

import queue
import threading
import time

from django_redis_lock import Lock, Semaphore

SECONDS = 60
REPORT = "report:nightly"
EXPORTS = "exports"
WORKERS = 4


def _report_worker(until: float) -> None:
    while time.monotonic() < until:
        with Lock(REPORT, wait=30, label="nightly report"):
            time.sleep(1.5)  # building it


def _export_worker(until: float) -> None:
    while time.monotonic() < until:
        with Semaphore(EXPORTS, limit=2, wait=30, label="CSV export"):
            time.sleep(2.0)


def _run(seconds: float) -> None:
    until = time.monotonic() + seconds
    threads = [
        threading.Thread(target=work, args=(until,), name=f"{kind}-worker-{number}", daemon=True)
        for kind, work in (("report", _report_worker), ("export", _export_worker))
        for number in range(1, WORKERS + 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def start(seconds: float = SECONDS) -> bool:
    """Start a run of ``seconds``; False when one is under way already."""
    started: queue.Queue[bool] = queue.Queue()

    def run() -> None:
        # Held by the thread that runs it, for as long as the run lasts.
        lock = Lock("demo:contention", wait=0, label="the demo's contention")
        if not lock.acquire():
            started.put(False)
            return
        started.put(True)
        try:
            _run(seconds)
        finally:
            lock.release()

    threading.Thread(target=run, name="contention", daemon=True).start()
    return started.get(timeout=30)
