"""A checkpoint archive loses its node-specific pid-file paths in place, nothing else."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from drivers.podman.archive import ArchiveUnusable, make_portable

CONFIG = {"conmonPidFile": "/run/node-1/overlay-containers/abc/userdata/conmon.pid",
          "pid_file": "/run/node-1/overlay-containers/abc/userdata/pidfile",
          "logPath": "/var/lib/node-1/ctr.log", "name": "main"}


def _archive(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _read(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        out = {}
        for m in tar:
            f = tar.extractfile(m)
            assert f is not None
            out[m.name] = f.read()
        return out


def test_the_pid_file_paths_are_cleared_and_the_archive_keeps_its_size(tmp_path: Path) -> None:
    path = tmp_path / "ck.tar"
    pages = bytes(range(256)) * 4096
    _archive(path, {"spec.dump": b"{}", "config.dump": json.dumps(CONFIG).encode(),
                    "checkpoint/pages-1.img": pages})
    size = path.stat().st_size
    assert make_portable(path)
    assert path.stat().st_size == size
    members = _read(path)
    config = json.loads(members["config.dump"])
    assert config["conmonPidFile"] == ""
    assert config["pid_file"] == ""
    assert config["logPath"] == CONFIG["logPath"]  # nothing else touched
    assert members["checkpoint/pages-1.img"] == pages
    assert not make_portable(path)  # a second pass finds nothing to do


def test_an_archive_without_a_config_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "ck.tar"
    _archive(path, {"spec.dump": b"{}"})
    with pytest.raises(ArchiveUnusable, match=r"config\.dump"):
        make_portable(path)
