"""No Redis for this folder: the suite's autouse fixtures that start the session's server,
point the caches at it, empty it before each test and check its keys after (``tests/conftest.py``)
are replaced here by ones that do nothing.

So ``pytest tests/engine`` starts no redis-server, and a test here that reached for Redis all
the same finds the cache's placeholder (``tests/settings.py``: port 1, where nothing listens)
and fails loudly. A test that needs a server belongs in another folder.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _caches_on_test_redis() -> None:
    return None


@pytest.fixture(autouse=True)
def _clean_redis_db() -> None:
    return None


@pytest.fixture(autouse=True)
def _every_key_of_ours_expires() -> set[str]:
    return set()
