"""The pure parts of lazy-pages migration: the runc wrapper's arguments, CRIU's logs and
checks read, the handoff archive (drivers.podman.lazy_runc, lazy_logs, lazy_checks,
lazy_handoff). The real thing runs in tests/criu/test_lazy_pages.py."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from drivers.podman.lazy_checks import (
    LAZY_PIPE_BYTES,
    dirty_tracking_refusal,
    has_capability,
    lazy_pages_refusal,
)
from drivers.podman.lazy_handoff import extract_images, with_request, write_handoff
from drivers.podman.lazy_logs import parse_dump_log, parse_fetch_log
from drivers.podman.lazy_runc import REQUEST, lazy_argv, take_request, work_path

CHECKPOINT = ["--log", "/run/x.log", "checkpoint", "--image-path", "/b/checkpoint",
              "--work-path", "/b", "ctr"]
RESTORE = ["restore", "--bundle", "/b", "--pid-file", "/r/pidfile", "--detach",
           "--image-path", "/b/checkpoint", "--work-path", "/b", "ctr"]


def test_a_serve_request_makes_runc_checkpoint_lazy_after_its_global_options() -> None:
    argv = lazy_argv(CHECKPOINT, {"serve": "127.0.0.1:4000"}, status_fd=7)
    assert argv[:3] == ["--log", "/run/x.log", "checkpoint"]
    assert argv[3:8] == ["--lazy-pages", "--page-server", "127.0.0.1:4000", "--status-fd", "7"]
    assert argv[8:] == CHECKPOINT[3:]


def test_a_fetch_request_makes_runc_restore_lazy_and_nothing_else_changes() -> None:
    assert lazy_argv(RESTORE, {"fetch": "/w/lazy-pages.socket"}, status_fd=None) == \
        ["restore", "--lazy-pages", *RESTORE[1:]]
    assert lazy_argv(RESTORE, {"serve": "127.0.0.1:4000"}, status_fd=None) == RESTORE
    assert lazy_argv(["state", "ctr"], {"fetch": "/s"}, status_fd=None) == ["state", "ctr"]
    assert work_path(RESTORE) == Path("/b")
    assert work_path(["checkpoint", "--help"]) is None  # podman's capability probe


def test_a_request_is_acted_on_once(tmp_path: Path) -> None:
    (tmp_path / REQUEST).write_text(json.dumps({"fetch": "/s"}))
    assert take_request(tmp_path) == {"fetch": "/s"}
    assert take_request(tmp_path) is None
    assert (tmp_path / "lazy-pages.taken").exists()


DUMP_LOG = """\
(00.000000) CRIU run id = 579faeb8
(00.000000) CRIU run id = a9e5292a
(00.030497) freezer.state=THAWED
(00.030606) freezer.state=FROZEN
(00.030836) Seized task 31575, state 1
(00.242787) Starting lazy pages server
(00.242796) Starting page server on port 52803
(00.242818) Running status-ready scripts
(00.833851) Accepted connection from 127.0.0.1:59932
(03.083751) page-xfer: Session over
(03.089825) Lazy pages transfer finished successfully
(03.089849) Unfreezing tasks into 2
(03.192577) Dumping finished successfully
"""


def test_the_dump_log_gives_the_frozen_time_from_freeze_to_last_page() -> None:
    log = parse_dump_log(DUMP_LOG)
    assert log.connected
    assert not log.failed
    assert log.frozen_seconds is not None
    assert abs(log.frozen_seconds - (3.089825 - 0.030606)) < 1e-9


def test_a_failed_transfer_has_no_frozen_time_and_says_whether_a_daemon_came() -> None:
    aborted = parse_dump_log(DUMP_LOG.split("(00.833851)")[0] +
                             "(00.278277) Error (criu/cr-dump.c:2019): Lazy pages transfer "
                             "FAILED.\n")
    assert aborted.failed
    assert not aborted.connected
    assert aborted.frozen_seconds is None
    assert parse_dump_log("").frozen_seconds is None


FETCH_LOG = """\
(00.579879) uffd: 1-11: Found 5 pages to be handled by UFFD
(00.579927) Connecting to server 127.0.0.1:52803
(00.581840) uffd: 1-11: uffd_copy: 0xf71c000/4096
(00.651318) uffd: 1-11: uffd_copy: 0x7f709a452000/16384
"""


def test_the_fetch_log_counts_pages_copied_of_those_expected() -> None:
    partial = parse_fetch_log(FETCH_LOG, page_size=4096)
    assert (partial.connected, partial.expected, partial.copied) == (True, 5, 5)
    assert not partial.complete  # no summary line: the daemon never finished the task
    done = parse_fetch_log(FETCH_LOG + "(00.742096) uffd: 1-11: UFFD transferred pages: "
                           "(5/5)\n", page_size=4096)
    assert done.complete
    short = parse_fetch_log(FETCH_LOG + "(00.742096) uffd: 1-11: UFFD transferred pages: "
                            "(4/5)\n", page_size=4096)
    assert not short.complete  # CRIU does not fail on it (uffd.c's check is #if 0)
    assert not parse_fetch_log("", page_size=4096).complete


def test_tasks_forked_or_exited_during_the_transfer_are_accounted_for() -> None:
    forked = FETCH_LOG + ("(00.700000) uffd: 1-11: FORK: child with ufd=12\n"
                          "(00.742096) uffd: 1-11: UFFD transferred pages: (5/5)\n")
    assert not parse_fetch_log(forked, page_size=4096).complete  # the child is not done
    child_done = forked + "(00.800000) uffd: 7-12: UFFD transferred pages: (5/5)\n"
    assert parse_fetch_log(child_done, page_size=4096).complete
    child_gone = forked + "(00.800000) uffd: 7-12: EXIT\n"
    assert parse_fetch_log(child_gone, page_size=4096).complete


def test_a_task_that_exits_mid_transfer_is_not_short_of_pages() -> None:
    """CRIU logs such a task both as short and as exited (a shell's ``sleep`` forked
    during the transfer): it needs no more pages, so the transfer is complete."""
    forked = FETCH_LOG + ("(00.700000) uffd: 1-11: FORK: child with ufd=-12\n"
                          "(00.742096) uffd: 1-11: UFFD transferred pages: (5/5)\n"
                          "(00.800000) uffd: 1--12: UFFD transferred pages: (691/4133)\n"
                          "(00.800100) uffd: 1--12: EXIT\n")
    log = parse_fetch_log(forked, page_size=4096)
    assert (log.done, log.short, log.exited) == (1, 0, 1)
    assert log.complete
    still_short = FETCH_LOG + "(00.742096) uffd: 1-11: UFFD transferred pages: (4/5)\n"
    assert parse_fetch_log(still_short, page_size=4096).short == 1


def test_pre_copy_refusal_names_the_kernel_feature() -> None:
    words = "Warn  (criu/cr-check.c:824): Dirty tracking is OFF. Memory snapshot will not work."
    reason = dirty_tracking_refusal(1, words)
    assert reason is not None
    assert "CONFIG_MEM_SOFT_DIRTY" in reason
    assert "Dirty tracking is OFF" in reason
    assert dirty_tracking_refusal(0, "") is None
    unknown = dirty_tracking_refusal(1, "Error (criu/cr-check.c:1866): Unknown feature x")
    assert unknown is not None
    assert "cannot check" in unknown


def test_post_copy_refusal_names_userfaultfd_or_the_pipe_limit() -> None:
    uffd = lazy_pages_refusal(1, "Error: UFFD is not supported", pipe_max_size=LAZY_PIPE_BYTES,
                              sys_resource=False)
    assert uffd is not None
    assert "userfaultfd" in uffd
    pipe = lazy_pages_refusal(0, "uffd-noncoop is supported", pipe_max_size=1 << 20,
                              sys_resource=False)
    assert pipe is not None
    assert "fs.pipe-max-size" in pipe
    assert lazy_pages_refusal(0, "", pipe_max_size=1 << 20, sys_resource=True) is None
    assert lazy_pages_refusal(0, "", pipe_max_size=LAZY_PIPE_BYTES, sys_resource=False) is None


def test_capabilities_are_read_from_the_effective_set() -> None:
    assert has_capability("CapInh:\t0\nCapEff:\t0000000001000000\n", 24)
    assert not has_capability("CapEff:\t00000000a80425fb\n", 24)
    assert not has_capability("", 24)


def _bundle(tmp_path: Path) -> tuple[Path, Path]:
    bundle, root, shm = tmp_path / "userdata", tmp_path / "merged", tmp_path / "shm"
    for folder in (bundle / "checkpoint", bundle / "artifacts", root / "etc", shm):
        folder.mkdir(parents=True)
    (bundle / "config.dump").write_text(json.dumps(
        {"ShmDir": str(shm), "conmonPidFile": "/run/node-a/conmon.pid", "pid_file": "/p"}))
    (bundle / "spec.dump").write_text("{}")
    (bundle / "ctr.log").write_text("1 1.0 ok\n")
    (bundle / "checkpoint" / "inventory.img").write_bytes(b"inv")
    (bundle / "dump.log").write_text("not handed over")
    (root / "etc" / "added").write_text("new")
    (shm / "segment").write_text("shared")
    return bundle, root


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: (tar.extractfile(m) or _Empty()).read() for m in tar}


class _Empty:
    def read(self) -> bytes:
        return b""


def test_the_handoff_holds_what_podman_exports_but_the_memory(tmp_path: Path) -> None:
    bundle, root = _bundle(tmp_path)
    archive = write_handoff(bundle, tmp_path / "handoff.tar", mountpoint=root, changes={
        "added": ["/etc/added"], "changed": ["/etc"], "deleted": ["/bin/true"]})
    members = _members(archive)
    assert {"config.dump", "spec.dump", "ctr.log", "checkpoint/inventory.img",
            "devshm-checkpoint.tar", "rootfs-diff.tar", "deleted.files"} <= set(members)
    assert "dump.log" not in members
    assert json.loads(members["deleted.files"]) == ["/bin/true"]
    config = json.loads(members["config.dump"])
    assert config["conmonPidFile"] == ""  # portable: the target picks its own
    diff = tmp_path / "diff.tar"
    diff.write_bytes(members["rootfs-diff.tar"])
    assert set(_members(diff)) == {"etc/added"}  # a changed folder is not taken whole


def test_the_target_gets_the_images_alone_and_a_request_beside_them(tmp_path: Path) -> None:
    bundle, root = _bundle(tmp_path)
    archive = write_handoff(bundle, tmp_path / "handoff.tar", mountpoint=root, changes={})
    extract_images(archive, tmp_path / "images")
    assert [p.name for p in (tmp_path / "images").iterdir()] == ["inventory.img"]
    copy = with_request(archive, tmp_path / "restore.tar", Path("/w/lazy-pages.socket"))
    assert json.loads(_members(copy)[REQUEST]) == {"fetch": "/w/lazy-pages.socket"}
    assert REQUEST not in _members(archive)
