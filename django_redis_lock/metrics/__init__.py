"""Metrics of the locks, for Prometheus and OpenTelemetry (``DJANGO_REDIS_LOCK_METRICS``).

Fed from one place, ``primitives/reports.py``, which every primitive reports through (locks,
semaphores, the guards built on them): it hands each event to the exporters that are on (its
*sinks*), and costs one empty-list check when none is. Labels: the primitive's kind and its
*group* (its name's template, ``core/labels.py``), never a name with an id in it.

- ``setup.py``: turns on the exporters the setting names (only ``apps.py`` imports it);
- ``buffer.py``, ``histograms.py``: events kept by one append, added up when read;
- ``prometheus.py``: counters and histograms in ``prometheus_client``'s registry (the
  ``prometheus`` extra; multi-process mode as ``prometheus_client`` does it);
- ``opentelemetry.py``: the same instruments through the OpenTelemetry metrics API (the
  ``opentelemetry`` extra).
"""
