"""The pages' CSS and JavaScript are package files (``controlplane/api/static``): each
page inlines their text (placeholders filled) and its CSP hashes exactly that text; every
static file is declared package data, so a non-editable install (the image) ships it."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from controlplane.api import dashboard, pages, summary

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "controlplane" / "api" / "static"


def inline(page: str, tag: str) -> str:
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.DOTALL)
    assert len(found) == 1
    return str(found[0])


@pytest.mark.parametrize(("module", "name"), [(dashboard, "dashboard"), (summary, "summary")],
                         ids=["dashboard", "summary"])
def test_the_page_inlines_its_files_and_its_csp_hashes_exactly_that(
        module: ModuleType, name: str) -> None:
    script, style = inline(module.PAGE, "script"), inline(module.PAGE, "style")
    assert style == "\n" + (STATIC / f"{name}.css").read_text(encoding="utf-8") + pages.NAV_CSS
    token_js = (STATIC / "token.js").read_text(encoding="utf-8")
    source = (STATIC / f"{name}.js").read_text(encoding="utf-8")
    assert script == ("\n" + source.replace("__POLL_MS__", str(dashboard.POLL_MS))
                      .replace("__TOKEN_JS__", "\n" + token_js))
    assert re.findall(r"__[A-Z_]+__", script) == []  # every placeholder filled
    assert f"script-src {pages.csp_hash(script)};" in module.CSP
    assert f"style-src {pages.csp_hash(style)};" in module.CSP


def test_every_static_file_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["controlplane.api"]
    files = sorted(p.relative_to(STATIC.parent).as_posix() for p in STATIC.iterdir())
    assert files
    assert [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)] == []
