"""The documentation keeps pace with the code."""

import ast
import asyncio
import re
from pathlib import Path

import pytest

from django_redis_lock import aclose_async_redis_clients, checks
from django_redis_lock.conf import SETTINGS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_setting_is_documented_with_its_default():
    text = (DOCS / "settings.md").read_text()
    for setting in SETTINGS.values():
        row = next((line for line in text.splitlines() if f"`{setting.full_name}`" in line), None)
        assert row is not None, f"{setting.full_name} missing from docs/settings.md"
        assert f"`{setting.default!r}`".replace("'", '"') in row, setting.full_name


def test_every_check_id_is_documented():
    documented = set(
        re.findall(r"django_redis_lock\.[EW]\d{3}", (DOCS / "settings.md").read_text())
    )
    in_code = set(re.findall(r"django_redis_lock\.[EW]\d{3}", checks.__doc__ or ""))
    assert in_code
    assert documented == in_code


def test_relative_links_resolve():
    root = DOCS.parent
    broken = []
    for page in [root / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                broken.append(f"{page.name}: {target}")
    assert broken == []


# -- every Python block in the docs runs, or says why it does not --------------------------

_BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]+) -->\n)?```python\n(?P<code>.*?)```", re.S)


def python_blocks():
    for page in [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start("code")) + 1
            yield pytest.param(match["code"], match["why"], id=f"{page.name}:{line}")


def _stubs():
    """What the snippets call as the reader's own code: plain functions that do nothing."""

    def work(*args, **kwargs):
        return "built"

    async def awork(*args, **kwargs):
        return None

    from django.core.cache import cache

    event = type("Event", (), {"id": 7})()
    feed = type("Feed", (), {"pk": 42})()
    return {
        "build_the_report": work, "build_report": work, "run_import": work, "handle": work,
        "refresh": awork, "event": event, "feed": feed, "cache": cache,
    }  # fmt: skip


@pytest.mark.parametrize(("code", "why"), list(python_blocks()))
def test_every_python_block_runs_or_says_why_not(code, why, redis_client):
    if why is not None:
        assert len(why.strip()) > 5  # a reason a reader understands
        return
    namespace = {"__name__": "docs_snippet", **_stubs()}
    compiled = compile(code, "<docs>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, namespace)
    if asyncio.iscoroutine(result):
        asyncio.run(_and_close(result))


async def _and_close(coroutine):
    try:
        await coroutine
    finally:
        await aclose_async_redis_clients()
