"""The project's addresses, in one place: the documentation site and the repository.

A message that sends its reader to the docs (a system check's hint, an error, the ACL advice)
names the site's page with :func:`docs_page`, never a file of the repository, which a user
who installed the wheel does not have. ``pyproject.toml``'s ``[project.urls]``, README's links
and ``mkdocs.yml``'s ``site_url`` say the same addresses; ``tests/package/test_links.py``
holds them to these.
"""

from __future__ import annotations

__all__ = ["DOCS_URL", "REPOSITORY_URL", "docs_page"]

DOCS_URL = "https://django-redis-lock.readthedocs.io/en/stable/"
REPOSITORY_URL = "https://github.com/django-redis-lock/django-redis-lock"


def docs_page(page: str, section: str = "") -> str:
    """The address of a page of the documentation site: ``page`` is its source under
    ``docs/`` (``"servers.md"``), ``section`` a heading's anchor on it. (The site is built
    with ``use_directory_urls: false``, so that it works opened from disk too.)"""
    if not page.endswith(".md"):
        raise ValueError(f"a page of the docs is named by its source, e.g. 'servers.md': {page!r}")
    address = DOCS_URL + page.removesuffix(".md") + ".html"
    return f"{address}#{section}" if section else address
