"""The documentation keeps pace with the code."""

import re
from pathlib import Path

from django_redis_lock import checks
from django_redis_lock.conf import SETTINGS

DOCS = Path(__file__).resolve().parent.parent / "docs"


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
