"""Turns the exporters on that ``DJANGO_REDIS_LOCK_METRICS`` names: when the app is ready
(``apps.py`` is the one importer of this module) and when the setting changes.

The exporters are imported here and only here, when named: they are optional extras, and they
sit above the readers of live state (``registry/``) that the lock's own path must never reach.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ..conf import PREFIX, InvalidSetting, lock_settings
from ..primitives.reports import Sink, add_sink, remove_sink

__all__ = ["configure"]

logger = logging.getLogger("django_redis_lock")

_configured: list[Sink] = []  # those DJANGO_REDIS_LOCK_METRICS turned on


def configure() -> None:
    """Turn on the exporters ``DJANGO_REDIS_LOCK_METRICS`` names (and off the others it had
    turned on). A bad value turns none on: the system checks report it."""
    try:
        names = lock_settings.METRICS
    except InvalidSetting as exc:
        logger.error("Lock metrics are off: %s", exc)
        names = ()
    for sink in _configured:
        remove_sink(sink)
    _configured.clear()
    for name in names:
        if name == "prometheus":
            from .prometheus import default_sink
        else:
            from .opentelemetry import default_sink  # type: ignore[assignment]
        sink = default_sink()
        _configured.append(sink)
        add_sink(sink)


@receiver(setting_changed)
def _metrics_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == f"{PREFIX}METRICS":
        configure()
