"""The public API's types tell the truth, as mypy sees them (``tests/typing/revealed.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[2]
REVEALED = ROOT / "tests" / "typing" / "revealed.py"


# The package's settings (setup.cfg), without its "tests.* are not type-checked" section.
CONFIG = """
[mypy]
python_version = 3.10
strict = True
plugins = mypy_django_plugin.main

[mypy.plugins.django-stubs]
django_settings_module = tests.settings

[mypy-django_redis.*]
ignore_missing_imports = True
"""


def test_revealed_types(tmp_path, monkeypatch):
    config = tmp_path / "mypy.ini"
    config.write_text(CONFIG)
    monkeypatch.chdir(ROOT)
    expected = {
        number: line.split("# ->", 1)[1].strip()
        for number, line in enumerate(REVEALED.read_text().splitlines(), start=1)
        if "reveal_type(" in line
    }
    stdout, stderr, _ = api.run(
        ["--config-file", str(config), "--no-error-summary", str(REVEALED.relative_to(ROOT))]
    )
    revealed = {
        int(match[1]): _modern(match[2])
        for match in re.finditer(r"revealed\.py:(\d+): note: Revealed type is \"(.*)\"", stdout)
    }
    assert revealed == expected, stdout + stderr


def _modern(revealed: str) -> str:
    """mypy before 1.16 wrote ``Union[builtins.str, None]`` for ``str | None``."""
    revealed = revealed.replace("builtins.", "")
    return re.sub(r"Union\[([^\[\]]+), None\]", r"\1 | None", revealed)
