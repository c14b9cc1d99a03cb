"""Stopping the product's processes at the end of a test world: every one is continued
(a paused agent must see its SIGTERM), asked to stop, given 20 s, then killed, and its
stdout pipe closed. Used by ``tests/e2e/world.py``, ``tests/support/process_deployment.py``
and ``tests/worker/test_crash_sigkill.py``.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterable
from typing import Any


def stop_processes(procs: Iterable[subprocess.Popen[Any]]) -> None:
    running = list(procs)
    for proc in running:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
    for proc in running:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
