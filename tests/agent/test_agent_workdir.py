"""The agent's work directory holds plain-text dumps: private, and emptied at start."""

from __future__ import annotations

import stat
from pathlib import Path

from drivers.agent.agent import prepare_workdir


def test_the_work_directory_is_private_and_job_leftovers_are_removed(tmp_path: Path) -> None:
    workdir = tmp_path / "agent"
    workdir.mkdir(mode=0o755)
    for job in ("capture-uid-1-ckpt", "restore-uid-2"):
        (workdir / job / "checkpoint").mkdir(parents=True)
        (workdir / job / "checkpoint" / "pages-1.img").write_bytes(b"secret memory")
    (workdir / "notes").mkdir()  # not ours: kept

    assert prepare_workdir(workdir) == 2

    assert sorted(p.name for p in workdir.iterdir()) == ["notes"]
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o700


def test_a_fresh_work_directory_is_made_private(tmp_path: Path) -> None:
    workdir = tmp_path / "new" / "agent"
    assert prepare_workdir(workdir) == 0
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o700
