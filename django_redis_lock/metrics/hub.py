"""The events ``reports.py`` sends, and the exporters (*sinks*) that receive them.

With no exporter on, ``sinks`` is empty and ``reports.py`` pays one truthiness check per event.
Which exporters are on comes from ``DJANGO_REDIS_LOCK_METRICS`` (``configure()``, called when
the app is ready and when the setting changes); tests and custom setups may ``add()`` their own.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from django.core.signals import setting_changed
from django.dispatch import receiver

from ..conf import PREFIX, InvalidSetting, lock_settings
from ..core.labels import bounded, reason_kind

__all__ = ["Sink", "add", "configure", "contended", "held", "lost", "remove", "sinks", "waited"]

logger = logging.getLogger("django_redis_lock")

# A wait's outcomes.
ACQUIRED, TIMED_OUT, ERROR = "acquired", "timed_out", "error"


class Sink(Protocol):
    """An exporter: where the events go. ``kind``: "lock", "semaphore"...; ``group``: the
    lock's group (``labels.py``), already bounded."""

    def waited(self, kind: str, group: str, outcome: str, seconds: float) -> None: ...

    def held(self, kind: str, group: str, seconds: float) -> None: ...

    def contended(self, kind: str, group: str) -> None: ...

    def lost(self, kind: str, group: str, reason: str) -> None: ...


sinks: list[Sink] = []
_configured: list[Sink] = []  # those DJANGO_REDIS_LOCK_METRICS turned on


def add(sink: Sink) -> None:
    if sink not in sinks:
        sinks.append(sink)


def remove(sink: Sink) -> None:
    if sink in sinks:
        sinks.remove(sink)


def _labels(lock: Any) -> tuple[str, str]:
    return type(lock).__name__.lower(), bounded(lock.group)


def waited(lock: Any, outcome: str, seconds: float) -> None:
    kind, group = _labels(lock)
    for sink in sinks:
        sink.waited(kind, group, outcome, seconds)


def held(lock: Any, seconds: float) -> None:
    kind, group = _labels(lock)
    for sink in sinks:
        sink.held(kind, group, seconds)


def contended(lock: Any) -> None:
    kind, group = _labels(lock)
    for sink in sinks:
        sink.contended(kind, group)


def lost(lock: Any, reason: str) -> None:
    kind, group = _labels(lock)
    reason = reason_kind(reason)
    for sink in sinks:
        sink.lost(kind, group, reason)


def configure() -> None:
    """Turn on the exporters ``DJANGO_REDIS_LOCK_METRICS`` names (and off the others it had
    turned on). A bad value turns none on: the system checks report it."""
    try:
        names = lock_settings.METRICS
    except InvalidSetting as exc:
        logger.error("Lock metrics are off: %s", exc)
        names = ()
    for sink in _configured:
        remove(sink)
    _configured.clear()
    for name in names:
        if name == "prometheus":
            from .prometheus import default_sink
        else:
            from .opentelemetry import default_sink  # type: ignore[assignment]
        sink = default_sink()
        _configured.append(sink)
        add(sink)


@receiver(setting_changed)
def _metrics_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == f"{PREFIX}METRICS":
        configure()
