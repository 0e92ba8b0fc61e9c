"""The release plumbing for the repository host, validated here (it runs there): the
workflows against GitHub's schema, the CI workflow mirroring ``.ci/run``'s steps, the release
workflow publishing with trusted publishing after a dry run on TestPyPI, and Read the Docs
building the same site with pinned dependencies."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def test_the_workflows_are_valid_github_workflows():
    """Checked against the schema check-jsonschema vendors (no network needed)."""
    workflows = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert len(workflows) >= 2
    checker = Path(sys.executable).parent / "check-jsonschema"
    done = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.github-workflows", *workflows],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def steps_run(workflow: dict) -> str:
    return "\n".join(
        step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]
    )


def test_ci_runs_what_ci_run_runs():
    ci = yaml.safe_load((WORKFLOWS / "ci.yml").read_text(encoding="utf-8"))
    runs = steps_run(ci) + "\n" + yaml.safe_dump(ci)
    local = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    targets = ("make test", "make lint", "make docs", "make test-wheel", "make compat")
    for target in (*targets, "TEST_REDIS_USER"):
        assert target in local, target
        assert target in runs, f"{target} is in .ci/run but not in the CI workflow"
    for env in ("py313-django61", "py310-django52-minimum"):
        assert env in local, env
        assert env in runs, env


def test_a_release_goes_to_testpypi_first_with_trusted_publishing():
    release = yaml.safe_load((WORKFLOWS / "release.yml").read_text(encoding="utf-8"))
    jobs = release["jobs"]
    assert jobs["testpypi"]["needs"] == "build"
    assert jobs["smoke"]["needs"] == "testpypi"
    assert jobs["pypi"]["needs"] == "smoke"
    for name in ("testpypi", "pypi"):
        assert jobs[name]["permissions"] == {"id-token": "write"}  # (no stored token)
        [publish] = [
            s for s in jobs[name]["steps"] if "gh-action-pypi-publish" in s.get("uses", "")
        ]
        assert "password" not in publish.get("with", {})
    assert "make test-wheel" in steps_run({"jobs": {"build": jobs["build"]}})


def test_read_the_docs_builds_the_same_site_with_pinned_dependencies():
    config = yaml.safe_load((ROOT / ".readthedocs.yaml").read_text(encoding="utf-8"))
    assert config["mkdocs"]["configuration"] == "mkdocs.yml"
    [pinned] = [i["requirements"] for i in config["python"]["install"] if "requirements" in i]
    lines = [
        line for line in (ROOT / pinned).read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]  # fmt: skip
    assert lines
    assert all("==" in line for line in lines), lines
    for wanted in ("mkdocs", "mkdocs-material", "mkdocstrings"):
        assert any(line.lower().startswith(f"{wanted}==") for line in lines), wanted


def tox_envs() -> set[str]:
    """tox.ini's envlist, its braces expanded (``py{312,313}-django{60,61}``)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "tox.ini", encoding="utf-8")
    envs: set[str] = set()
    for line in config["tox"]["envlist"].split():
        names = [""]
        for literal, choices in re.findall(r"([^{]*)(?:\{([^}]*)\})?", line):
            names = [
                name + literal + choice
                for name in names
                for choice in (choices.split(",") if choices else [""])
            ]
        envs.update(names)
    return envs


def test_every_matrix_corner_our_prose_names_is_a_tox_env():
    """The matrix moves (Django 4.2 went, 6.1 came): a page that still names a corner that is
    gone sends a contributor to run what does not exist."""
    envs = tox_envs()
    assert {"py310-django52", "py313-django61", "py310-django52-minimum"} <= envs
    named = {}
    paths = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / ".ci" / "run"]
    for path in [*paths, *(ROOT / "docs").glob("*.md"), *WORKFLOWS.glob("*.yml")]:
        for env in re.findall(r"\bpy3\d+-django\d+(?:-[a-z]+)?\b", path.read_text("utf-8")):
            named.setdefault(env, path.name)
    stale = {env: where for env, where in named.items() if env not in envs}
    assert not stale, f"not in tox.ini's envlist: {stale}"
    assert named  # the prose does name some
