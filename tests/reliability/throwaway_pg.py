"""A throwaway PostgreSQL server of a test's own, to stop and start at will.

Stopping the machine's shared server would break every other test run on it, so the
database-fault test runs its own: ``initdb`` into a temporary directory and ``pg_ctl``
on a free loopback port (as the ``postgres`` user when the tests run as root, since
``initdb`` refuses root). ``stop()`` is a fast shutdown (clients' connections are cut,
as when the server crashes or fails over); ``start()`` brings the same data back.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from drivers.loopback import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (/usr/lib/postgresql/*/bin)")
    return found[-1]


class ThrowawayPostgres:
    def __init__(self, root: Path) -> None:
        self.root, self.data, self.port = root, root / "data", free_port()
        self.as_postgres = os.geteuid() == 0
        self.log = root / "server.log"

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if self.as_postgres else []
        subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=120,
                       stdin=subprocess.DEVNULL)

    def init(self) -> None:
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                        "-c fsync=off -c max_connections=200", "start")

    def stop(self) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[ThrowawayPostgres]:
    root = Path(tempfile.mkdtemp(prefix="cp-pg-"))
    server = ThrowawayPostgres(root)
    try:
        server.init()
        server.start()
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
