"""A real Prometheus for a test: Debian's ``prometheus`` on a free loopback port, with its
own configuration and storage in a temporary directory, scraping and evaluating every
second, and read through its HTTP API (``/api/v1/query_range``, ``/api/v1/alerts``,
``/api/v1/targets``).

Static targets are fixed at start; the file-discovered ones (``file_sd``: the node
agents, whose metrics port is new at every start) are rewritten with
:meth:`Prometheus.discover`, as a Kubernetes pod restart changes its address. Used by
``tests/monitoring/world.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.monitoring.tools import binary
from tests.support.waiting import wait_for

#: How often it scrapes and evaluates rules: a test waits seconds, not minutes.
INTERVAL = "1s"
LISTENING = re.compile(r'msg="Listening on" address=(\S+)')
READY_SECONDS = 30


class Prometheus:
    """One Prometheus process; :meth:`start`, then query; :meth:`stop` always."""

    def __init__(self, workdir: Path, *, rules: Path,
                 static: Mapping[str, Sequence[str]], discovered: str) -> None:
        self.workdir = workdir
        self.rules = rules
        self.static = static
        self.discovered = discovered  # the job whose targets come from file_sd
        self.targets_file = workdir / f"{discovered}.json"
        self.log = workdir / "prometheus.log"
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, discovered: Mapping[str, str]) -> None:
        """Start it with ``discovered`` (instance -> ``host:port``) as the file-discovered
        targets; return once it listens and is ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.discover(discovered)
        config = {
            "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL,
                       "evaluation_interval": INTERVAL},
            "rule_files": [str(self.rules)],
            "scrape_configs": [
                *({"job_name": job, "static_configs": [{"targets": list(targets)}]}
                  for job, targets in self.static.items()),
                {"job_name": self.discovered, "file_sd_configs": [
                    {"files": [str(self.targets_file)], "refresh_interval": INTERVAL}]},
            ],
        }
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [binary("prometheus"), f"--config.file={path}",
                 f"--storage.tsdb.path={self.workdir / 'data'}",
                 "--web.listen-address=127.0.0.1:0", "--log.level=info"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        address = wait_for(self._listening, "Prometheus listening", READY_SECONDS)
        self.url = f"http://{address}"
        wait_for(self._ready, "Prometheus ready", READY_SECONDS)

    def _listening(self) -> str | None:
        assert self.proc is not None
        text = self.log.read_text(errors="replace")
        assert self.proc.poll() is None, f"prometheus exited: {text[-2000:]}"
        found = LISTENING.search(text)
        return found.group(1) if found else None

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as response:
                return bool(response.status == 200)
        except urllib.error.HTTPError as exc:
            exc.close()
            return False
        except OSError:
            return False

    def discover(self, targets: Mapping[str, str]) -> None:
        """Replace the file-discovered targets (written whole, then renamed into place)."""
        groups = [{"targets": [address], "labels": {"agent": name}}
                  for name, address in sorted(targets.items())]
        partial = self.targets_file.with_suffix(".partial")
        partial.write_text(json.dumps(groups))
        os.replace(partial, self.targets_file)

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>?params``: its ``data``; fails on an error answer."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}",
                                    timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result now (``[{metric, value: [time, "text"]}]``)."""
        found: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return found

    def query_range(self, expr: str, *, start: float, end: float,
                    step: str = INTERVAL) -> dict[str, Any]:
        """The whole answer of a range query (``status``, ``data`` or ``error``)."""
        query = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}",
                                        "end": f"{end:.3f}", "step": step})
        request = urllib.request.Request(f"{self.url}/api/v1/query_range?{query}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answer: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                answer = json.loads(exc.read())
        return answer

    def alerts(self) -> list[dict[str, Any]]:
        """The pending and firing alerts, as ``/api/v1/alerts`` lists them."""
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return found

    def targets_up(self) -> bool:
        active = self.api("targets", state="active")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def terminate(self) -> None:
        """Ask it to stop (it flushes its storage meanwhile); :meth:`stop` waits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
