"""Whether this host can migrate memory live with CRIU: pre-copy, post-copy (lazy pages).

Each answer is ``None`` (it can) or the reason it cannot, naming the kernel feature or
setting, as an operator reads it. Pure functions read CRIU's and the kernel's answers
(:func:`dirty_tracking_refusal`, :func:`lazy_pages_refusal`); thin runners ask them
(:func:`dirty_tracking_available`, :func:`lazy_pages_available`, and
:func:`lazy_dump_refusal` for the dumping node alone). Callers: the node agent, to say
which migration modes its node offers; :mod:`drivers.podman.lazy`; the tests.

- **Pre-copy** (``criu pre-dump`` rounds while the process runs, then a short final dump)
  needs the kernel's soft-dirty page bits (``CONFIG_MEM_SOFT_DIRTY``): CRIU's
  ``criu check --feature mem_dirty_track`` (cr-check.c) fails without them, ``--track-mem``
  is refused and ``runc checkpoint --pre-dump`` says CRIU lacks features.
- **Post-copy** needs non-cooperative userfaultfd on the restoring node (``criu check
  --feature uffd-noncoop``), and on the dumping node a pipe of 4 MiB: the lazy dump keeps
  the pages in pipes, and its page server copies (``tee``) them through a pipe grown to
  CRIU's ``PIPE_MAX_SIZE`` (819 pages, which the kernel rounds up to 1024: page-pipe.c). Above
  ``fs.pipe-max-size`` (1 MiB by default) that needs ``CAP_SYS_RESOURCE``; without it the
  transfer fails with "page-pipe: tee: ... Operation not permitted".
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

DIRTY_TRACK = "mem_dirty_track"
UFFD = "uffd-noncoop"
#: The pipe size CRIU's lazy page server needs: PIPE_MAX_SIZE pages, rounded up by the kernel.
LAZY_PIPE_BYTES = 4 << 20
PIPE_MAX_SIZE = Path("/proc/sys/fs/pipe-max-size")
CAP_SYS_RESOURCE = 24


def _words(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return " | ".join(lines[-3:]) or "(no message)"


def dirty_tracking_refusal(returncode: int, output: str) -> str | None:
    """Why pre-copy cannot work, from ``criu check --feature mem_dirty_track`` (its exit
    code and its words, stdout and stderr together); ``None`` when it can. Pure."""
    if returncode == 0:
        return None
    if "Unknown feature" in output:
        return f"this CRIU cannot check {DIRTY_TRACK}: {_words(output)}"
    return ("the kernel has no soft-dirty page tracking (CONFIG_MEM_SOFT_DIRTY), so CRIU "
            f"cannot pre-copy memory: criu check --feature {DIRTY_TRACK}: {_words(output)}")


def lazy_pages_refusal(returncode: int, output: str, *, pipe_max_size: int,
                       sys_resource: bool) -> str | None:
    """Why post-copy cannot work, from ``criu check --feature uffd-noncoop`` and the pipe
    limit (``fs.pipe-max-size``; ``sys_resource``: CRIU runs with ``CAP_SYS_RESOURCE``,
    which lifts it); ``None`` when it can. Pure."""
    if returncode != 0:
        return ("the kernel has no non-cooperative userfaultfd, which CRIU's lazy restore "
                f"needs: criu check --feature {UFFD}: {_words(output)}")
    if pipe_max_size < LAZY_PIPE_BYTES and not sys_resource:
        return (f"fs.pipe-max-size is {pipe_max_size} bytes and CRIU lacks "
                f"CAP_SYS_RESOURCE: its lazy page server needs a {LAZY_PIPE_BYTES}-byte "
                f"pipe (sysctl -w fs.pipe-max-size={LAZY_PIPE_BYTES} on the dumping node)")
    return None


def has_capability(status: str, capability: int) -> bool:
    """Whether ``/proc/<pid>/status`` text shows ``capability`` effective. Pure."""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> capability & 1)
    return False


def criu_binary() -> str:
    """The CRIU that works on this kernel (``$CONTROLPLANE_CRIU``, scripts/ensure-criu)."""
    return os.environ.get("CONTROLPLANE_CRIU") or "criu"


def _check(feature: str, *, criu: str | None, timeout: float) -> tuple[int, str]:
    try:
        done = subprocess.run([criu or criu_binary(), "check", "--feature", feature],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, f"{criu or criu_binary()} is not installed (run scripts/ensure-criu)"
    except subprocess.TimeoutExpired:
        return 124, f"criu check did not answer within {timeout:g}s"
    return done.returncode, done.stdout + done.stderr


def lazy_dump_refusal() -> str | None:
    """Why this node cannot serve a lazy dump's pages (the pipe limit), or ``None``: checked
    before anything is frozen, since CRIU only fails once the target asks for a page."""
    return lazy_pages_refusal(
        0, "", pipe_max_size=int(PIPE_MAX_SIZE.read_text()),
        sys_resource=has_capability(Path("/proc/self/status").read_text(), CAP_SYS_RESOURCE))


def dirty_tracking_available(*, criu: str | None = None, timeout: float = 30.0) -> str | None:
    """``None`` when pre-copy could work here, else why not (:func:`dirty_tracking_refusal`)."""
    return dirty_tracking_refusal(*_check(DIRTY_TRACK, criu=criu, timeout=timeout))


def lazy_pages_available(*, criu: str | None = None, timeout: float = 30.0) -> str | None:
    """``None`` when post-copy can work here (both nodes on this host), else why not
    (:func:`lazy_pages_refusal`)."""
    code, output = _check(UFFD, criu=criu, timeout=timeout)
    return lazy_pages_refusal(code, output, pipe_max_size=0, sys_resource=True) or \
        lazy_dump_refusal()
