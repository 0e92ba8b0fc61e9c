"""Metrics of the locks, for Prometheus and OpenTelemetry (``DJANGO_REDIS_LOCK_METRICS``).

Fed from one place, ``reports.py``, which every primitive reports through (locks, semaphores,
the guards built on them); ``hub.py`` hands each event to the exporters that are on, and costs
one empty-list check when none is. Labels: the primitive's kind and its *group* (its name's
template, ``labels.py``), never a name with an id in it.

- ``hub.py``: the events, and the exporters in use;
- ``labels.py``: a lock's group, and the few reasons a lease is lost;
- ``prometheus.py``: counters and histograms in ``prometheus_client``'s registry (the
  ``prometheus`` extra; multi-process mode as ``prometheus_client`` does it);
- ``opentelemetry.py``: the same instruments through the OpenTelemetry metrics API (the
  ``opentelemetry`` extra).
"""
