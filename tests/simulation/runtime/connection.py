"""A redis-py connection whose socket is the simulation's network (``network.py``): a pool
makes it from ``connection_class``, as ``CONNECTION_POOL_KWARGS`` in ``CACHES`` says."""

from __future__ import annotations

from typing import Any

from redis.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from .network import Link, current, current_or_none, packed

__all__ = ["SimulatedConnection"]


class SimulatedConnection(Connection):
    """A redis-py connection whose socket is the simulation's :class:`Network`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.link: Link | None = None

    @property
    def is_connected(self) -> bool:
        return self.link is not None and not self.link.dead

    def connect(self) -> None:
        """The pool's, as it lends the connection: one that was cut is made anew. (redis-py
        before 6 finds a closed connection by looking for unread data as it lends it, later
        ones when a request on it fails: the simulation does the former on every version, so
        that a schedule runs alike on each.) A request on a connection cut while it is lent
        fails (:meth:`send_packed_command`)."""
        if self.link is not None and self.link.dead:
            self.disconnect()
        self._linked()

    def _linked(self) -> None:
        self.link = current().link_for(self.link, self.host, self.port)

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        self.connect()

    def disconnect(self, *args: Any, **kwargs: Any) -> None:
        if self.link is not None:
            network = current_or_none()
            if network is not None:
                network.close(self.link)
            self.link = None

    def check_health(self) -> None:
        return None

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._linked()
        assert self.link is not None
        try:
            current().send(self.link, packed(command))
        except BaseException:
            self.disconnect()
            raise

    def can_read(self, timeout: float = 0) -> bool:
        self._linked()
        assert self.link is not None
        return current().readable(self.link, timeout or 0)

    def read_response(
        self, disable_decoding: bool = False, *, timeout: Any = None,
        disconnect_on_error: bool = True, push_request: bool = False,
    ) -> Any:  # fmt: skip
        if self.link is None:
            raise RedisConnectionError("simulated: read on a closed connection")
        limit = self.socket_timeout if timeout is None else timeout
        try:
            reply = current().read(self.link, limit)
        except BaseException as error:
            if disconnect_on_error and not getattr(error, "before_read", False):
                self.disconnect()
            raise
        if isinstance(reply, ResponseError):
            raise reply
        return reply
