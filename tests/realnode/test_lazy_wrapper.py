"""The pure and file-level half of lazy pages on real nodes: the runtime wrapper turns a
checkpoint's memory-less images into a lazy restore only when a daemon is registered for
their page server, and a lazy-pages log counts as complete only when every task got all
its pages or exited. Runs everywhere (no node needed)."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from drivers.realnode.lazy import every_task_fetched, handed_over_pages, rootfs_changes
from drivers.realnode.runc_wrapper import (
    LAZY_IMAGES,
    LAZY_REQUEST,
    lazy_fetches,
    request_lazy_restore,
)


def restore_argv(tmp_path: Path) -> list[str]:
    for name in ("runc", "images", "work"):
        (tmp_path / name).mkdir()
    return [f"--root={tmp_path / 'runc'}", "restore", "--bundle", str(tmp_path / "work"),
            "--detach", "--image-path", str(tmp_path / "images"),
            "--work-path", str(tmp_path / "work"), "ctr-1"]


def test_a_restore_of_complete_images_is_left_alone(tmp_path: Path) -> None:
    argv = restore_argv(tmp_path)
    request_lazy_restore(argv)
    assert not (tmp_path / "work" / LAZY_REQUEST).exists()


def test_memory_less_images_are_fetched_from_the_registered_daemon(tmp_path: Path) -> None:
    argv = restore_argv(tmp_path)
    (tmp_path / "images" / LAZY_IMAGES).write_text(json.dumps({"serve": "127.0.0.1:4242"}))
    daemon_socket = tmp_path / "daemon" / "lazy-pages.socket"
    daemon_socket.parent.mkdir()
    daemon_socket.touch()
    registered = lazy_fetches(tmp_path / "runc") / "127.0.0.1:4242.socket"
    registered.parent.mkdir()
    registered.symlink_to(daemon_socket)
    request_lazy_restore(argv)
    request = json.loads((tmp_path / "work" / LAZY_REQUEST).read_text())
    assert request == {"fetch": str(daemon_socket)}


def test_memory_less_images_without_a_daemon_are_not_restored(tmp_path: Path) -> None:
    argv = restore_argv(tmp_path)
    (tmp_path / "images" / LAZY_IMAGES).write_text(json.dumps({"serve": "127.0.0.1:4242"}))
    with pytest.raises(SystemExit, match="no lazy-pages daemon is registered"):
        request_lazy_restore(argv, wait_seconds=0.2)
    assert not (tmp_path / "work" / LAZY_REQUEST).exists()


def test_a_daemon_registered_while_the_restore_waits_is_used(tmp_path: Path) -> None:
    """The agent registers its daemon as the kubelet starts the restore: a race the
    wrapper waits out (the registration comes from another thread here)."""
    argv = restore_argv(tmp_path)
    (tmp_path / "images" / LAZY_IMAGES).write_text(json.dumps({"serve": "127.0.0.1:4242"}))
    daemon_socket = tmp_path / "daemon" / "lazy-pages.socket"
    daemon_socket.parent.mkdir()
    daemon_socket.touch()
    registered = lazy_fetches(tmp_path / "runc") / "127.0.0.1:4242.socket"
    registered.parent.mkdir()
    later = threading.Timer(0.3, registered.symlink_to, (daemon_socket,))
    later.start()
    try:
        request_lazy_restore(argv, wait_seconds=30)
    finally:
        later.join()
    request = json.loads((tmp_path / "work" / LAZY_REQUEST).read_text())
    assert request == {"fetch": str(daemon_socket)}


LOG = """\
(00.85) uffd: 1-11: Found 4133 pages to be handled by UFFD
(00.86) uffd: 12-12: Found 9 pages to be handled by UFFD
(00.93) uffd: 12-12: UFFD transferred pages: (9/9)
(00.94) uffd: 1-11: FORK: child with ufd=12
(00.95) uffd: 1-12: EXIT
(00.95) uffd: 1--12: UFFD transferred pages: (691/4133)
(00.96) uffd: 1-11: UFFD transferred pages: (4133/4133)
"""


def test_a_forked_child_that_exited_early_does_not_make_the_fetch_short() -> None:
    assert every_task_fetched(LOG)


def test_a_task_left_short_makes_the_fetch_incomplete() -> None:
    assert not every_task_fetched(LOG.replace("(4133/4133)", "(4000/4133)"))
    assert not every_task_fetched(LOG.replace("(00.95) uffd: 1-12: EXIT\n", ""))
    assert not every_task_fetched("")


def test_rootfs_changes_leave_mount_points_out_and_list_whiteouts(tmp_path: Path) -> None:
    """Overlay whiteouts are 0/0 character devices (making one needs CAP_MKNOD)."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "hosts").write_text("mounted over")
    (tmp_path / "moved.txt").write_text("moved")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "termination-log").write_text("")
    try:
        os.mknod(tmp_path / "etc" / "motd", stat.S_IFCHR | 0o600, 0)
    except PermissionError:
        pytest.skip("making a whiteout needs CAP_MKNOD")
    files, deleted = rootfs_changes(tmp_path, {"/etc/hosts", "/dev"})
    assert sorted(files) == ["etc", "moved.txt"]
    assert deleted == ["/etc/motd"]


def test_pages_received_count_the_tasks_handed_over_not_their_children() -> None:
    """The forked child's 691 copies are left out; the task that exited needs none."""
    assert handed_over_pages(LOG) == (4133 + 9, 4133 + 9)
    assert handed_over_pages(LOG.replace("(4133/4133)", "(4000/4133)")) == (4000 + 9, 4142)
    assert handed_over_pages("") == (0, 0)
