"""The project's addresses, in one place (``django_redis_lock/links.py``): README as a package
index renders it leads nowhere relative, the metadata and the docs site say the same
addresses, and no message sends a user to a file of the repository they do not have."""

from __future__ import annotations

import ast
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from readme_renderer.markdown import render

from django_redis_lock.links import DOCS_URL, REPOSITORY_URL, docs_page

if sys.version_info >= (3, 11):
    import tomllib
else:  # (pytest's own dependency there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


class _Addresses(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.found.append(value)


def readme_addresses() -> list[str]:
    html = render((ROOT / "README.md").read_text(encoding="utf-8"))
    assert html is not None, "README does not render as the package index renders it"
    parser = _Addresses()
    parser.feed(html)
    return parser.found


def test_readme_rendered_for_the_package_index_has_no_relative_link():
    addresses = readme_addresses()
    assert addresses, "README has no link at all?"
    relative = [a for a in addresses if not a.startswith(("https://", "http://", "#"))]
    assert relative == []


def test_readmes_links_into_the_docs_site_name_pages_that_exist():
    pages = {path.relative_to(ROOT / "docs").as_posix() for path in (ROOT / "docs").rglob("*")}
    pages |= {"changelog.md"}  # (made from CHANGELOG.md by docs/_site/hooks.py)
    missing = []
    for address in readme_addresses():
        if not address.startswith(DOCS_URL):
            continue
        path = address.removeprefix(DOCS_URL).partition("#")[0] or "index.html"
        source = path.removesuffix(".html") + ".md" if path.endswith(".html") else path
        if source not in pages:
            missing.append(address)
    assert missing == []


def test_the_metadata_and_the_docs_site_say_the_same_addresses():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    urls = project["urls"]
    assert urls["Documentation"] == DOCS_URL
    assert urls["Source"] == urls["Homepage"] == REPOSITORY_URL
    assert urls["Issues"] == f"{REPOSITORY_URL}/issues"
    assert urls["Changelog"] == docs_page("changelog.md")
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert site["site_url"] == DOCS_URL
    assert site["repo_url"] == REPOSITORY_URL
    assert site["use_directory_urls"] is False  # (docs_page's .html addresses)


def test_docs_page_names_a_page_of_the_site():
    assert docs_page("servers.md") == f"{DOCS_URL}servers.html"
    assert docs_page("views.md", "who-may-be-replayed-a-response").endswith(
        "views.html#who-may-be-replayed-a-response"
    )
    with pytest.raises(ValueError, match=r"servers\.md"):
        docs_page("servers")


def test_no_message_of_the_package_names_a_file_of_the_repository():
    """A string the package says (not a docstring, not a comment) names no ``docs/*.md``: a
    user who installed the wheel has no such file; :func:`docs_page` gives the site's page."""
    docstring_nodes = set()
    offenders = []
    for path in sorted((ROOT / "django_redis_lock").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                docstring_nodes.add(id(body[0].value))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstring_nodes
                and re.search(r"\bdocs/[\w-]+\.md", node.value)
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
