"""MkDocs hooks (``mkdocs.yml``, ``hooks:``): the site's pages from outside ``docs/``.

The pages in ``docs/`` link to files beside it (``../benchmarks/results.md``) so that they read
well on the repository host. The site carries those files under the same path
(``benchmarks/results.md``, every benchmark's results and the files the pages link to) and
the links are rewritten to match; ``CHANGELOG.md`` becomes the changelog page. Nothing else is
changed: ``make docs`` builds the Markdown as it is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
# A relative link out of docs/: ](../benchmarks/results.md) or ](../benchmarks/results.md#a).
OUTSIDE = re.compile(r"\]\(\.\./([^)#\s]+)")


def _outside_files(docs: Path) -> set[str]:
    """The repository's files the site carries: every benchmark's results, and whatever a page
    links to outside docs/."""
    paths = {str(path.relative_to(ROOT)) for path in (ROOT / "benchmarks").glob("results*.md")}
    for page in docs.glob("*.md"):
        paths.update(OUTSIDE.findall(page.read_text(encoding="utf-8")))
    return paths


def on_files(files: Files, config: Any) -> Files:
    for path in sorted(_outside_files(Path(config["docs_dir"]))):
        files.append(File.generated(config, path, abs_src_path=str(ROOT / path)))
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    files.append(
        File.generated(config, "changelog.md", content=changelog.replace("](docs/", "]("))
    )
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if "/" in page.file.src_uri:  # a page carried from outside docs/: its links stay
        return markdown
    return OUTSIDE.sub(r"](\1", markdown)
