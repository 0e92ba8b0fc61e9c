"""Quorum mode: one lock on several independent Redis servers, held while a majority holds it.

- ``broadcast.py``: one command to every server at once, answers read as they arrive (redis-py's
  public connection API only);
- ``client.py``: :class:`QuorumClient`, the engine's scripts run as a majority (Redlock);
- ``votes.py``: what each server's reply says, read without I/O.
"""

from __future__ import annotations

from .client import AsyncQuorumClient, QuorumClient, QuorumUnavailable

__all__ = ["AsyncQuorumClient", "QuorumClient", "QuorumUnavailable"]
