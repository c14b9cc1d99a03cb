"""The previous release, as ``CHANGELOG.md`` records it, checked out into a directory of its own.

``CHANGELOG.md`` names each release and the commit it was cut from (git tags may not
travel with a copy of the repository). :func:`releases` reads those entries;
:func:`check_out` writes the previous release's tree (``git archive <commit>``) into a
directory, and :func:`environment` runs Python on it: the same interpreter and
site-packages as this tree (``.venv``) with that directory first on ``PYTHONPATH``, which
:func:`check_out` allows only when both releases pin the same dependencies
(``pyproject.toml``'s ``dependencies`` and ``constraints.txt``); otherwise the test
would need a venv of the old release's own and says so.

Used by ``tests/upgrade/test_rolling_upgrade.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_RELEASE = re.compile(r"^## (?P<version>\d+\.\d+\.\d+) — (?P<date>\S+)\n(?P<body>.*?)(?=^## |\Z)",
                      re.MULTILINE | re.DOTALL)
_CUT_FROM = re.compile(r"Cut from commit \*\*(?P<commit>[0-9a-f]{7,40})\*\*")


@dataclass(frozen=True)
class Release:
    version: str
    commit: str | None  # None: the release this tree is (cut from a commit after this file)


def releases(changelog: Path = ROOT / "CHANGELOG.md") -> list[Release]:
    """The releases ``CHANGELOG.md`` lists, newest first."""
    out = []
    for match in _RELEASE.finditer(changelog.read_text()):
        cut = _CUT_FROM.search(match["body"])
        out.append(Release(match["version"], cut["commit"] if cut else None))
    return out


def _dependencies(pyproject: str) -> list[str]:
    deps: list[str] = tomllib.loads(pyproject)["project"]["dependencies"]
    return deps


def check_out(release: Release, into: Path) -> Path:
    """The release's ``controlplane``, ``drivers`` and ``migrations`` under ``into``."""
    assert release.commit is not None, f"{release.version} names no commit"
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", release.commit, "controlplane",
         "drivers", "migrations", "pyproject.toml", "constraints.txt"],
        capture_output=True, timeout=120, check=False)
    assert archive.returncode == 0, (
        f"cannot check out release {release.version} ({release.commit}): "
        f"{archive.stderr.decode(errors='replace')} "
        "(a shallow clone lacks it: git fetch --unshallow)")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True, timeout=120)
    old_project = (into / "pyproject.toml").read_text()
    version = tomllib.loads(old_project)["project"]["version"]
    assert version == release.version, (
        f"commit {release.commit} is version {version}, CHANGELOG.md says {release.version}")
    same = (_dependencies(old_project) == _dependencies((ROOT / "pyproject.toml").read_text())
            and (into / "constraints.txt").read_text() == (ROOT / "constraints.txt").read_text())
    assert same, (f"release {release.version} pins other dependencies than this tree: it needs "
                  "a venv of its own (python -m venv; pip install -c constraints.txt .)")
    return into


def environment(tree: Path) -> dict[str, str]:
    """The environment of a process that runs ``tree``'s code (cwd: ``tree``)."""
    return {**os.environ, "PYTHONPATH": str(tree)}


def imported_from(tree: Path) -> dict[str, str]:
    """Where a process started with :func:`environment` imports each package from."""
    probe = subprocess.run(
        [sys.executable, "-c", "import controlplane, drivers, migrations\n"
         "for m in (controlplane, drivers, migrations): print(m.__name__, m.__file__)"],
        cwd=tree, env=environment(tree), capture_output=True, text=True, timeout=60,
        check=True)
    return dict(line.split(" ", 1) for line in probe.stdout.splitlines())
