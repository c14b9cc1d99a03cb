"""``fs.pipe-max-size`` raised for CRIU's lazy page server while any test process needs it.

CRIU's lazy page server grows a pipe to 4 MiB, above the default limit (this host has no
CAP_SYS_RESOURCE to exceed it). Several modules need it, and pytest-xdist runs them in
parallel processes: one putting the old value back while another still transfers pages
would fail that one. So the holders are counted in a file under a lock: the first raises
the limit and records the old value, the last puts it back (holders that died are
dropped, so a killed run does not pin the limit). Used by the lazy-pages test modules.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from drivers.podman.lazy_checks import LAZY_PIPE_BYTES, PIPE_MAX_SIZE

STATE = Path(tempfile.gettempdir()) / "controlplane-pipe-max-size.json"


@contextlib.contextmanager
def _locked() -> Iterator[dict[str, object]]:
    with STATE.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(STATE.read_text())
        except (OSError, ValueError):
            state = {}
        holders = [p for p in state.get("holders") or [] if _alive(int(p))]
        if not holders:
            state = {"old": state.get("old", int(PIPE_MAX_SIZE.read_text()))}
        state["holders"] = holders
        yield state
        if state["holders"]:
            STATE.write_text(json.dumps(state))
        else:
            STATE.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def pipe_limit_raised() -> Iterator[None]:
    """At least :data:`LAZY_PIPE_BYTES` while the block runs; the old value afterwards,
    once no other process holds it."""
    with _locked() as state:
        holders = state["holders"]
        assert isinstance(holders, list)
        if int(PIPE_MAX_SIZE.read_text()) < LAZY_PIPE_BYTES:
            PIPE_MAX_SIZE.write_text(str(LAZY_PIPE_BYTES))
        holders.append(os.getpid())
    try:
        yield
    finally:
        with _locked() as state:
            holders = state["holders"]
            assert isinstance(holders, list)
            if os.getpid() in holders:
                holders.remove(os.getpid())
            old = state.get("old")
            if not holders and isinstance(old, int) and old < LAZY_PIPE_BYTES:
                PIPE_MAX_SIZE.write_text(str(old))
