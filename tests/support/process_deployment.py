"""The product deployed in separate processes, as operators run it: a :class:`Deployment`
starts ``cpctl sim up`` (the cluster), a ``python -m drivers.agent`` per node and ``cpctl
worker``, runs ``cpctl`` verbs against its database, creates marked pods through the
simulator's API, and stops every process it started. Used by
``tests/cli/test_cluster_verbs.py`` (its ``deployment`` fixture) and
``tests/cli/processes.py`` (``deployed``, for the drain, restore and checkpoints CLI tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.cpctl import ROOT, cpctl
from tests.support.stopping import stop_processes
from tests.support.waiting import wait_for

MARKER = "sim.controlplane.dev/marker"
REPO = "localhost:5000/checkpoints"


class Deployment:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.kubeconfig = tmp / "kube.yaml"
        self.layout = tmp / "oci"
        self.db = f"sqlite:///{tmp / 'cp.db'}"
        self.procs: list[subprocess.Popen[str]] = []
        self.agents: dict[str, subprocess.Popen[str]] = {}
        self.url = ""
        self.worker_line = ""

    def start(self, name: str, *args: str) -> subprocess.Popen[str]:
        with (self.tmp / f"{name}.stderr").open("w") as err:
            proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, text=True,
                                    stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def cluster_args(self) -> list[str]:
        return ["--kubeconfig", str(self.kubeconfig), "--registry-layout", str(self.layout)]

    def cpctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return cpctl(self.db, *args)

    def api(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST" if body else "GET",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.api("/api/v1/namespaces/default/pods")["items"]
        return items

    def wait(self, check: Any, what: str, limit: float = 30) -> Any:
        return wait_for(check, what, limit)  # other processes: nothing to await

    def pod(self, name: str, node: str) -> None:
        self.api("/api/v1/namespaces/default/pods", {
            "metadata": {"name": name, "annotations": {MARKER: f"{name}=1"}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "pause"}]}})
        self.wait(lambda: any(p["metadata"]["name"] == name
                              and p["status"].get("phase") == "Running" for p in self.pods()),
                  f"{name} running")

    def stop(self) -> None:
        stop_processes(self.procs)
