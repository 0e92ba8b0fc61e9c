"""The locks' metrics: Prometheus and OpenTelemetry exporters, the events' buffer, the
``/metrics`` view, and the scrape-time gauges of what is held and waited for now.
"""
