"""docs/resources.md's "Try it locally", run as written: its first block (one command:
the simulator serving the CRDs, with agents and a worker on it) prints its ready line,
then its second block runs under ``bash -euo pipefail`` with the real ``kubectl`` first on
``PATH``, and the Migration it applies succeeds: ``kubectl wait`` meets the condition,
``kubectl get migrations`` prints the table the page shows (all but its age),
``kubectl describe`` shows the status the worker wrote and ``cpctl history`` the
operation's events, the first recorded by the front door. A page that drifts from the
simulator, the CRDs or the CLI fails here, not in a newcomer's first hour."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.walkthrough import commands, console_output, section, sh_blocks, started

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "resources.md"
HEADING = "Try it locally"
KUBECTL = os.environ.get("CONTROLPLANE_TEST_KUBECTL", str(ROOT / ".venv" / "bin" / "kubectl"))
pytestmark = pytest.mark.slow


def test_the_section_starts_the_world_in_one_command_and_migrates_through_a_resource() -> None:
    start, use = sh_blocks(PAGE, HEADING)[:2]
    assert len(commands(start)) == 1
    assert "--crds deploy/base/crds" in start
    assert "kind: Migration" in use
    assert "cpctl history" in use


def test_try_it_locally_runs_as_written(tmp_path: Path) -> None:
    if not os.access(KUBECTL, os.X_OK):
        pytest.fail(f"{KUBECTL} is missing: run scripts/ensure-kustomize", pytrace=False)
    for shared in (".venv", "deploy"):
        (tmp_path / shared).symlink_to(ROOT / shared)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(KUBECTL)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("KUBECONFIG", None)
    env.pop("CONTROLPLANE_DATABASE_URL", None)
    start, use = sh_blocks(PAGE, HEADING)[:2]
    with started(start, tmp_path, env=env) as ready:
        assert ready[0].startswith("simulated cluster listening on http://127.0.0.1:"), ready
        assert "the CRDs of deploy/base/crds" in ready[0]
        assert "a worker on" in ready[0]
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", use], cwd=tmp_path,
                                env=env, text=True, capture_output=True, timeout=180,
                                stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = result.stdout
    assert "migration.checkpoint.controlplane.dev/move-app created" in out, out
    assert "migration.checkpoint.controlplane.dev/move-app condition met" in out, out

    shown = console_output(section(PAGE, HEADING), "kubectl get migrations")
    lines = out.splitlines()
    header = lines.index(shown[0])  # the header, word for word, then the row but its age
    assert lines[header + 1].split()[:-1] == shown[1].split()[:-1], out

    pods = next(line for line in lines if line.startswith("app "))
    assert pods.split()[2] == "Running", out
    assert "node-2" in pods.split(), out
    assert re.search(r"^\s+Phase:\s+Succeeded$", out, flags=re.MULTILINE), out
    uid = re.search(r"Operation ID:\s+([0-9a-f-]{36})", out)
    assert uid is not None, out
    history = out[out.index("SEQ "):]
    assert "by frontdoor" in history, history
    assert "MigrationFinished" in history, history
    assert uid[1] in history, history  # the artifact's tag ends with the operation's id
