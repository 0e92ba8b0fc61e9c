"""A TCP proxy between the lock's client and a real redis-server, to lose replies on purpose.

What comes back can be passed on, dropped (the client waits for a reply that never comes: a
blackhole), held back (a slow server: passed on, in order, when the test says) or cut (the
client's connection is reset as the reply arrives): that is how a release whose reply was lost
looks, since the request did reach Redis. Requests can be dropped too (lost on the way), and
new connections refused (after ``cut_connections()``, a request cannot even be sent).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

PASS, DROP_REPLIES, RESET_ON_REPLY = "pass", "drop replies", "reset on reply"
DROP_REQUESTS, REFUSE, HOLD_REPLIES = "drop requests", "refuse", "hold replies"


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.mode = PASS
        self.dropped = 0  # replies dropped so far (DROP_REPLIES)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        # HOLD_REPLIES: what came back meanwhile, in order; ``held`` is set when there is some.
        self._passing = threading.Lock()
        self._held: list[tuple[socket.socket, bytes]] = []
        self.held = threading.Event()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        threading.Thread(target=self._accept, daemon=True, name="test-proxy").start()

    def cut_connections(self) -> None:
        """Close every connection made so far (with a reset). SHUT_RD wakes the pump reading
        from it (see :meth:`close`) and sends nothing; the last close then resets."""
        sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RD)
            with contextlib.suppress(OSError):
                sock.close()

    def let_go(self) -> None:
        """Pass on the replies held back (HOLD_REPLIES), in order, and those to come."""
        with self._passing:
            self.mode = PASS
            held, self._held = self._held, []
            self.held.clear()
            for sink, data in held:
                with contextlib.suppress(OSError):
                    sink.sendall(data)

    def close(self) -> None:
        """Close the listener and every connection. Shut down first: a socket that a pump
        thread is reading from is not closed by ``close()`` alone (the kernel keeps it open
        for the read in progress), so the client would never learn that its connection has
        gone, and without a socket timeout it would wait on it for good (once the watch for
        dead holders, a thread for the whole process: every later test of the process saw
        no death)."""
        self._closed = True
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == REFUSE:
                client.close()
                continue
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    sink.close()
                return
            if self.mode == (DROP_REPLIES if replies else DROP_REQUESTS):
                self.dropped += replies
                continue
            if replies and self.mode == RESET_ON_REPLY:
                # SO_LINGER 0: close with a reset, as a failing network or middlebox would.
                with contextlib.suppress(OSError):
                    sink.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sink.close()
                continue
            with self._passing:  # (in order with let_go()'s)
                if replies and self.mode == HOLD_REPLIES:
                    self._held.append((sink, data))
                    self.held.set()
                    continue
                with contextlib.suppress(OSError):
                    sink.sendall(data)
