"""Kept import path: quorum mode's client now lives in ``backends/quorum/``; its error is
``django_redis_lock.QuorumUnavailable``."""

from ..backends.quorum import AsyncQuorumClient, QuorumClient, QuorumUnavailable

__all__ = ["AsyncQuorumClient", "QuorumClient", "QuorumUnavailable"]
