"""The OCI runtime of a node that migrates with lazy pages: runc, plus CRIU's lazy flags
when the container's bundle asks for them.

podman 4.3 has no lazy-pages option, and it runs the runtime with a fixed argument list
and an environment of ``PATH`` and ``XDG_RUNTIME_DIR`` only: the one channel to runc is
the container's bundle (podman's ``userdata`` directory, runc's ``--work-path``). So a
node whose :class:`~drivers.podman.podman.PodmanNode` names :func:`script` as its
runtime runs this file for every runc call; :mod:`drivers.podman.lazy` drops a request,
``lazy-pages.json``, into the bundle before it calls podman, and this wrapper consumes it
(renames it away: one request, one runc call):

- ``checkpoint`` + ``{"serve": "ADDR:PORT", "ready": FIFO, "pid": FILE}``: ``runc
  checkpoint --lazy-pages --page-server ADDR:PORT --status-fd N``, N the FIFO opened for
  writing. runc writes one byte to it when CRIU has written every image but the memory
  and its page server listens; the reader sees end-of-file instead when runc and CRIU
  exit without that. FILE gets runc's pid (the page server is its ``criu`` child).
- ``restore`` + ``{"fetch": SOCKET}``: ``runc restore --lazy-pages``. CRIU's restore
  hands the memory of the restored tasks to a ``criu lazy-pages`` daemon through
  ``lazy-pages.socket`` in its work directory; lazy.py started that daemon, and its
  socket is linked into the work path here.

Any other call, or one without a request, execs runc with its arguments unchanged. It
needs the standard library only and runs with ``-I -S`` (as
:mod:`drivers.realnode.runc_wrapper` does); :func:`install_runtime` writes the script
podman runs.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

REQUEST = "lazy-pages.json"
SOCKET = "lazy-pages.socket"  # CRIU's name, relative to its work directory
#: runc's global options that take a value (``runc --root R --log L checkpoint ...``).
GLOBAL_WITH_VALUE = ("--root", "--log", "--log-format", "--criu", "--rootless")


def command_index(argv: list[str]) -> int | None:
    """Where runc's command word is in ``argv`` (after its global options)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in GLOBAL_WITH_VALUE else 1
    return i if i < len(argv) else None


def option(argv: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``argv``."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def work_path(argv: list[str]) -> Path | None:
    """The directory podman gave runc for this call's logs and files (its bundle)."""
    found = option(argv, "--work-path") or option(argv, "--bundle")
    return Path(found) if found else None


def lazy_argv(argv: list[str], request: dict[str, Any], *, status_fd: int | None) -> list[str]:
    """runc's arguments with the lazy flags the request asks for (pure)."""
    at = command_index(argv)
    if at is None:
        return argv
    command = argv[at]
    if command == "checkpoint" and "serve" in request and status_fd is not None:
        extra = ["--lazy-pages", "--page-server", str(request["serve"]),
                 "--status-fd", str(status_fd)]
    elif command == "restore" and "fetch" in request:
        extra = ["--lazy-pages"]
    else:
        return argv
    return [*argv[:at + 1], *extra, *argv[at + 1:]]


def take_request(work: Path) -> dict[str, Any] | None:
    """Read and consume the bundle's request (renamed to ``.taken``: kept for a post-mortem,
    never acted on twice)."""
    path = work / REQUEST
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    path.replace(path.with_suffix(".taken"))
    request: dict[str, Any] = json.loads(raw)
    return request


def open_status(fifo: str) -> int:
    """The write end of lazy.py's FIFO, inheritable, blocking (runc writes one byte)."""
    # Non-blocking open: ENXIO at once if nobody reads (lazy.py gone), not a hang.
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    os.set_inheritable(fd, True)
    return fd


def script(*, python: str, runc: str) -> str:
    """The executable a lazy-capable node's podman runs as its runtime."""
    return (f"#!/bin/sh\nLAZY_RUNC={runc} exec {python} -I -S {Path(__file__).resolve()}"
            ' "$@"\n')


def install_runtime(path: Path, *, runc: str | None = None) -> str:
    """Write the lazy-capable runtime (:mod:`drivers.podman.lazy_runc`) to ``path``; the
    ``runtime`` a node's :class:`PodmanNode` takes. podman records it in every container
    it creates, so it must stay where it is while they live. Idempotent, and atomic: the
    kubelet role and the node agents of one runtime root install the same file while
    podman may be running it."""
    text = script(python=sys.executable, runc=runc or shutil.which("runc") or "/usr/sbin/runc")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.read_text() == text:
            return str(path)
    except OSError:
        pass
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(text)
    staging.chmod(0o755)
    staging.replace(path)
    return str(path)


#: The wrapper's file in a runtime root (``cpctl sim nodes --runtime-root DIR``), beside
#: the nodes' storage roots ``DIR/<node>``.
ROOT_RUNTIME = "lazy-runc"


def runtime_under(root: Path, *, lazy: bool) -> str:
    """The OCI runtime the nodes under ``root`` run: the lazy wrapper (installed there,
    the same for the kubelet role and every node agent) or plain ``runc``."""
    return install_runtime(root.resolve() / ROOT_RUNTIME) if lazy else "runc"


def is_lazy_runtime(runtime: str) -> bool:
    """Whether podman's runtime ``runtime`` (a name or a path) is the lazy wrapper."""
    try:
        return "lazy_runc" in Path(runtime).read_text(errors="replace")
    except OSError:
        return False


def main(argv: list[str]) -> None:
    runc = os.environ.get("LAZY_RUNC", "/usr/sbin/runc")
    at = command_index(argv)
    work = work_path(argv)
    if at is not None and argv[at] in ("checkpoint", "restore") and work is not None:
        request = take_request(work)
        if request is not None:
            status_fd = None
            if argv[at] == "checkpoint":
                status_fd = open_status(str(request["ready"]))
                Path(str(request["pid"])).write_text(f"{os.getpid()}\n")
            elif "fetch" in request:
                link = work / SOCKET
                link.unlink(missing_ok=True)
                link.symlink_to(str(request["fetch"]))
            argv = lazy_argv(argv, request, status_fd=status_fd)
    os.execv(runc, [runc, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
