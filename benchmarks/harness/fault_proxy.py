"""A TCP proxy in front of a redis-server that can cut every connection and refuse new ones.

For ``bench_faults.py``. ``tests/support/proxy.py`` (the suite's) can lose replies and cut
connections; this one adds what a fault campaign needs from the network: **refusing** new
connections for a while, by no longer listening on its port (a client's ``connect()`` gets
``ECONNREFUSED`` at once, as from a server that is down), and listening again on the same port
afterwards, so the clients' URL stays valid.

One thread serves every connection (``selectors``), so a proxy with many clients does not add a
pair of threads per connection to the process that runs it. Control calls (``cut``,
``refuse``, ``accept``, ``close``) are carried out by that thread and return once done.

    proxy = FaultProxy("127.0.0.1", 6379).start()
    ... proxy.url ...
    proxy.refuse()  # cut every connection, refuse new ones
    proxy.accept()  # listen again
    proxy.close()
"""

from __future__ import annotations

import contextlib
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable

__all__ = ["FaultProxy"]

_CHUNK = 65536


def _reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), as a failing network or middlebox would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    """Passes bytes both ways between its clients and ``host:port``, until told otherwise."""

    def __init__(self, host: str, port: int, *, listen_host: str = "127.0.0.1") -> None:
        self.target = (host, port)
        self.host = listen_host
        self._listener: socket.socket | None = self._listen_socket(0)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"redis://{self.host}:{self.port}/0"
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._tasks: queue.SimpleQueue[tuple[Callable[[], None], threading.Event]] = (
            queue.SimpleQueue()
        )
        self._peers: dict[socket.socket, socket.socket] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self.accepted = 0  # connections passed on
        self.cuts = 0  # connections cut by cut()/refuse()

    # -- control (any thread) ----------------------------------------------------------------

    def start(self) -> FaultProxy:
        assert self._listener is not None
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fault-proxy")
        self._thread.start()
        return self

    def cut(self) -> None:
        """Reset every connection made so far; new ones are still accepted."""
        self._call(self._cut_all)

    def refuse(self) -> None:
        """Reset every connection and stop listening: new connections are refused."""

        def refuse() -> None:
            self._cut_all()
            self._stop_listening()

        self._call(refuse)

    def accept(self) -> None:
        """Listen again on the same port (after :meth:`refuse`)."""
        self._call(self._start_listening)

    def close(self) -> None:
        if self._thread is None or self._closed:
            return

        def close() -> None:
            self._cut_all()
            self._stop_listening()
            self._closed = True

        self._call(close)
        self._thread.join(timeout=5)
        for sock in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                sock.close()
        self._selector.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, task: Callable[[], None]) -> None:
        if self._thread is None:
            raise RuntimeError("the proxy has not been started")
        done = threading.Event()
        self._tasks.put((task, done))
        self._wake_write.send(b"x")
        if not done.wait(timeout=10):
            raise RuntimeError("the proxy thread did not carry out a control call")

    # -- the proxy's thread -----------------------------------------------------------------

    def _listen_socket(self, port: int) -> socket.socket:
        # create_server sets SO_REUSEADDR (POSIX): the port can be bound again at once.
        listener = socket.create_server((self.host, port), backlog=128)
        listener.setblocking(False)
        return listener

    def _serve(self) -> None:
        while not self._closed:
            for key, _events in self._selector.select(timeout=1.0):
                sock = key.fileobj
                if sock is self._wake_read:
                    self._run_tasks()
                elif sock is self._listener:
                    self._accept()
                elif sock in self._peers:  # not closed by an earlier event of this batch
                    self._forward(sock)
                if self._closed:
                    return

    def _run_tasks(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._wake_read.recv(_CHUNK)
        while True:
            try:
                task, done = self._tasks.get_nowait()
            except queue.Empty:
                return
            try:
                task()
            finally:
                done.set()

    def _accept(self) -> None:
        while self._listener is not None:
            try:
                client, _address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=1.0)
            except OSError:  # the server is down: so is the connection
                _reset(client)
                continue
            for sock in (client, server):
                sock.setblocking(True)
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._peers[client] = server
            self._peers[server] = client
            self._selector.register(client, selectors.EVENT_READ)
            self._selector.register(server, selectors.EVENT_READ)
            self.accepted += 1

    def _forward(self, source: socket.socket) -> None:
        sink = self._peers[source]
        try:
            data = source.recv(_CHUNK)
        except OSError:
            data = b""
        if data:
            try:
                # Blocking, but small: a lock's requests and replies fit the socket buffers.
                sink.sendall(data)
                return
            except OSError:
                pass
        # One side closed (a restarting server, a client that hung up): close the other too.
        self._drop(source, reset=False)

    def _drop(self, sock: socket.socket, *, reset: bool) -> None:
        peer = self._peers.pop(sock, None)
        pair = [sock] if peer is None else [sock, peer]
        if peer is not None:
            self._peers.pop(peer, None)
        for one in pair:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(one)
            if reset:
                _reset(one)
            else:
                with contextlib.suppress(OSError):
                    one.close()

    def _cut_all(self) -> None:
        clients = {min(a, b, key=id) for a, b in self._peers.items()}
        for sock in clients:
            self._drop(sock, reset=True)
            self.cuts += 1

    def _stop_listening(self) -> None:
        if self._listener is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self._listener)
        with contextlib.suppress(OSError):
            self._listener.close()
        self._listener = None

    def _start_listening(self) -> None:
        if self._listener is not None:
            return
        deadline = time.monotonic() + 2.0
        while True:
            try:
                self._listener = self._listen_socket(self.port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self._selector.register(self._listener, selectors.EVENT_READ)
