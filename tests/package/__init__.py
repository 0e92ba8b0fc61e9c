"""The repository around the code: the built sdist and wheel, the public API and its import
paths, its types as mypy sees them, the documentation's examples, the example project, and
the development tooling (``dev/embedded_redis.py``).
"""
