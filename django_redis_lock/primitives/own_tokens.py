"""This process's own tokens: whose hold each is, so that a refusal by a holder of this very
process says so instead of naming a stranger."""

from __future__ import annotations

import os
import weakref
from typing import Any

from ..core.lease import holder_token

__all__ = ["OwnTokens", "own_tokens"]


class OwnTokens:
    """The tokens of the holds this process has now, and whose each is: a refusal whose holder
    is one of them says "held by this very thread", not a stranger's name. (Single dict
    operations, atomic under the GIL: an acquisition takes no lock for this.)"""

    def __init__(self) -> None:
        self._owners: dict[str, weakref.ref[object]] = {}

    def add(self, token: str, owner: object) -> None:
        self._owners[token] = weakref.ref(owner)

    def discard(self, token: str) -> None:
        self._owners.pop(token, None)

    def holds(self, owner: object, value: Any) -> bool:
        """Whether the lease value ``value`` (a holder's, read from Redis) is a hold of
        ``owner``'s, in this process."""
        token = holder_token(value)
        held = self._owners.get(token) if token is not None else None
        return held is not None and held() is owner

    def clear(self) -> None:
        self._owners = {}


own_tokens = OwnTokens()


os.register_at_fork(after_in_child=own_tokens.clear)
