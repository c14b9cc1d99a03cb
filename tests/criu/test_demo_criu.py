"""``cpctl demo --runtime criu`` shows a person a real process migrated and resumed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.criu.world import require_runtime

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_the_criu_demo_proves_each_process_went_on_from_its_checkpoint(tmp_path: Path) -> None:
    require_runtime()
    done = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "demo", "--runtime",
                           "criu", "--workdir", str(tmp_path / "demo")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if "(not 1, no gap)" in line]
    assert len(lines) == 2, done.stdout  # the migration and the resume
    assert "0 projection mismatches, 0 decisions that would now differ" in done.stdout
