"""A started process's stdout (its log) copied on to a file by a thread, so the pipe never
fills and stalls it. Used by the real-CRIU world (``tests/criu/world.py``) and the
product on real nodes (``tests/realnode/product.py``)."""

from __future__ import annotations

import contextlib
import subprocess
import threading
from pathlib import Path


def pump_to_file(proc: subprocess.Popen[str], target: Path, name: str) -> None:
    """Append every further line of ``proc``'s stdout to ``target`` until it closes."""
    stream = proc.stdout
    assert stream is not None

    def copy() -> None:
        with target.open("a") as out, contextlib.suppress(ValueError, OSError):
            for line in stream:
                out.write(line)
                out.flush()

    threading.Thread(target=copy, daemon=True, name=f"log-{name}").start()
