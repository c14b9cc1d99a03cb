"""The loopback registry real nodes pull from: Debian's ``docker-registry`` (CNCF
distribution v2) on 127.0.0.1, a free port it picks itself, storage under the world's
folder, deletes enabled. Plain HTTP: the nodes' registries.conf marks it insecure.
Started and stopped by :mod:`.world`; ``scripts/ensure-realnode`` installs it.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

BINARY = Path("/usr/bin/docker-registry")
LISTENING = re.compile(r"listening on (127\.0\.0\.1:\d+)")


@dataclass
class LoopbackRegistry:
    proc: subprocess.Popen[bytes]
    host: str  # 127.0.0.1:<port>
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_registry(folder: Path, *, limit: float = 20) -> LoopbackRegistry:
    if not BINARY.exists():
        raise RuntimeError(f"{BINARY} is missing: run scripts/ensure-realnode "
                           "(it installs Debian's docker-registry)")
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "version": 0.1, "log": {"level": "info", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(folder / "storage")},
                    "delete": {"enabled": True},
                    "maintenance": {"uploadpurging": {"enabled": False}}},
        "http": {"addr": "127.0.0.1:0", "secret": "controlplane-realnode"}}))
    log = folder / "registry.log"
    with log.open("ab") as out:
        # setpriv: it ends with the process that started it, even one killed with SIGKILL.
        proc = subprocess.Popen(["setpriv", "--pdeathsig=TERM", "--", str(BINARY), "serve",
                                 str(config)], stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    # Another process's log line is the only signal it listens: poll it.
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = LISTENING.search(log.read_text(errors="replace"))
        if found:
            return LoopbackRegistry(proc, found.group(1), log)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with contextlib.suppress(Exception):
        LoopbackRegistry(proc, "", log).stop()
    raise RuntimeError(f"docker-registry did not listen: {log.read_text(errors='replace')[-2000:]}")
