"""The image's recipe, checked without building it (``scripts/build-image`` builds and runs
it; docs/install.md): every stage's base is the one ``BASE_IMAGE``, pinned by digest,
and the build scripts parse and refuse a base given by tag alone."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy.manifests import ROOT

DOCKERFILE = ROOT / "Dockerfile"
SCRIPTS = [ROOT / "scripts" / "build-image", ROOT / "scripts" / "make-base-image"]
PINNED = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each line, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in lines if line and not line.startswith("#")]


def test_the_default_base_is_pinned_by_digest() -> None:
    args = [a for i, a in instructions() if i == "ARG" and a.startswith("BASE_IMAGE=")]
    assert len(args) == 1, args
    base = args[0].removeprefix("BASE_IMAGE=")
    assert PINNED.match(base), f"BASE_IMAGE={base} is not NAME@sha256:<digest>"


def test_every_stage_starts_from_the_pinned_base_or_an_earlier_stage() -> None:
    stages: list[str] = []
    for instruction, args in instructions():
        if instruction != "FROM":
            continue
        words = args.split()
        assert words[0] == "${BASE_IMAGE}" or words[0] in stages, \
            f"FROM {args}: not the pinned BASE_IMAGE"
        if len(words) == 3 and words[1].upper() == "AS":
            stages.append(words[2])
    assert stages == ["build"]


def test_pip_gets_the_ca_bundle_only_as_a_build_secret() -> None:
    """A bundle baked into a layer would ship the build network's CA in the image."""
    pip_runs = [a for i, a in instructions() if i == "RUN" and "pip install" in a]
    assert len(pip_runs) == 2
    for run in pip_runs:
        assert run.startswith("--mount=type=secret,id=pip_ca,required=false"), run
    assert "PIP_CERT" not in "".join(a for i, a in instructions() if i in {"ENV", "ARG"})


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_build_script_parses(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                          timeout=10, check=False)
    assert done.returncode == 0, done.stderr


def test_build_image_refuses_a_base_that_is_not_pinned() -> None:
    done = subprocess.run([str(SCRIPTS[0]), "--base", "python:3.11-slim-bookworm"],
                          capture_output=True, text=True, timeout=10, check=False)
    assert done.returncode == 1
    assert "not pinned by digest" in done.stderr
