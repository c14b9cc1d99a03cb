"""The manifests' processes on one machine: what the kubelet would start, started here.

:class:`DeployedRun` renders an overlay and runs, as real subprocesses against
``cpctl sim up`` and a real OCI registry (Debian's ``docker-registry``) on loopback: the
migration Job's container, the Deployment's init container, its worker container once per
replica and its API container, and the DaemonSet's container once per simulated node —
each with the command, args and environment the rendered objects give it
(:mod:`tests.deploy.manifests`). Only what cannot exist off-cluster is substituted, and
each substitution is listed in :data:`SUBSTITUTIONS`. Each component talks to the
simulator with a kubeconfig whose bearer token names its ServiceAccount
(``system:serviceaccount:<ns>:<name>``), so the simulator's audit tells who made which
API call (the RBAC exactness test).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.deploy.manifests import (
    ROOT,
    Obj,
    container,
    container_command,
    container_env,
    find,
    pod_spec,
)

T = TypeVar("T")
NAMESPACE = "checkpoint-system"
REGISTRY_BIN = "/usr/bin/docker-registry"
SUBSTITUTIONS = {
    "--in-cluster": "--kubeconfig <the component's simulator kubeconfig>",
    "--dumper=kubelet": "--dumper=sim (the simulator has no kubelet)",
    "--workdir=...": "a temporary directory per node (an emptyDir in the cluster)",
    "--listen=0.0.0.0:8080": "--listen=127.0.0.1:0 (any free port)",
    "--metrics-listen=0.0.0.0:9090": "--metrics-listen=127.0.0.1:0 (any free port)",
    "secret controlplane-database/url": "the test's database URL",
    "cpctl / python": "this interpreter (-m controlplane.cli.main)",
    "downward API": "metadata.name = <deployment>-<i>, spec.nodeName = the node, "
                    "status.hostIP = 127.0.0.1",
}


def service_account_user(name: str, namespace: str = NAMESPACE) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def wait_for(check: Callable[[], T | None], what: str, limit: float = 60) -> T:
    """Poll a condition another process makes true (nothing to await across processes)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class DeployedRun:
    objects: list[Obj]
    tmp: Path
    db_url: str
    sim_url: str = ""
    registry: str = ""
    api_url: str = ""
    procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    exit_codes: dict[str, int] = field(default_factory=dict)
    # what the scenario observed (tests/deploy/test_deployed.py)
    migrated: subprocess.CompletedProcess[str] | None = None
    pods: list[Obj] = field(default_factory=list)
    drained: subprocess.CompletedProcess[str] | None = None
    drained_pods: list[Obj] = field(default_factory=list)
    healthz: Any = None
    metrics: str = ""
    audit: list[dict[str, Any]] = field(default_factory=list)

    # --- the world ------------------------------------------------------------------

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              ) -> subprocess.Popen[str]:
        exe = {"cpctl": [sys.executable, "-m", "controlplane.cli.main"],
               "python": [sys.executable]}.get(argv[0], [argv[0]])
        with (self.tmp / f"{name}.stderr").open("w") as err:
            proc = subprocess.Popen([*exe, *argv[1:]], cwd=ROOT, text=True,
                                    env=None if env is None else self.image_env(env),
                                    stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL)
        self.procs[name] = proc
        return proc

    def run(self, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        exe = {"cpctl": [sys.executable, "-m", "controlplane.cli.main"]}[argv[0]]
        return subprocess.run([*exe, *argv[1:]], cwd=ROOT, env=self.image_env(env),
                              capture_output=True,
                              text=True, timeout=180, stdin=subprocess.DEVNULL, check=False)

    def image_env(self, env: dict[str, str]) -> dict[str, str]:
        """A container's environment: the image's (PATH, HOME) plus the manifest's only."""
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.tmp),
                **env}

    def stderr(self, name: str) -> str:
        return (self.tmp / f"{name}.stderr").read_text()

    def start_simulator(self) -> None:
        base = self.tmp / "sim.kubeconfig"
        sim = self.start("sim", ["cpctl", "sim", "up", "--nodes", "3", "--kubeconfig",
                                 str(base)])
        assert sim.stdout is not None
        self.sim_url = sim.stdout.readline().split("listening on ")[1].split()[0]

    def kubeconfig(self, service_account: str) -> str:
        """A kubeconfig for the simulator whose token names the ServiceAccount."""
        config = yaml.safe_load((self.tmp / "sim.kubeconfig").read_text())
        config["users"][0]["user"]["token"] = service_account_user(service_account)
        path = self.tmp / f"{service_account}.kubeconfig"
        path.write_text(json.dumps(config))
        return str(path)

    def start_registry(self) -> None:
        assert Path(REGISTRY_BIN).exists(), \
            f"{REGISTRY_BIN} is missing: run scripts/ensure-registry"
        config = {"version": 0.1, "log": {"level": "info", "accesslog": {"disabled": True}},
                  "storage": {"filesystem": {"rootdirectory": str(self.tmp / "registry")},
                              "delete": {"enabled": True}},
                  "http": {"addr": "127.0.0.1:0", "secret": "deploy-tests"}}
        path = self.tmp / "registry.yml"
        path.write_text(json.dumps(config))
        log = self.tmp / "registry.log"
        with log.open("w") as out:
            self.procs["registry"] = subprocess.Popen(
                [REGISTRY_BIN, "serve", str(path)], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, text=True)

        def listening() -> str | None:
            for line in log.read_text().splitlines():
                if "listening on 127.0.0.1:" in line:
                    return line.split("listening on ")[1].split()[0].strip('"')
            return None

        self.registry = wait_for(listening, "the registry to listen", limit=20)

    def sim_api(self, path: str, body: dict[str, Any] | None = None) -> Any:
        """The test's own requests (no token: not attributed to any component)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.sim_url + path, data=data,
                                     method="POST" if body else "GET",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    # --- the manifests' containers --------------------------------------------------

    def env(self, c: Obj, fields: dict[str, str]) -> dict[str, str]:
        env = container_env(self.objects, c, fields,
                            secrets={("controlplane-database", "url"): self.db_url})
        assert env["CONTROLPLANE_DATABASE_URL"] == self.db_url
        return env

    def control_plane(self, name: str, replica: int) -> tuple[list[str], dict[str, str]]:
        """A container of the control plane Deployment: argv and environment."""
        deployment = find(self.objects, "Deployment", "controlplane")
        init = name == "wait-for-schema"
        c = container(deployment, name, init=init)
        env = self.env(c, {"metadata.name": f"controlplane-{replica}"})
        argv = container_command(c, env)
        account = pod_spec(deployment)["serviceAccountName"]
        if "--in-cluster" in argv:
            i = argv.index("--in-cluster")
            argv[i:i + 1] = ["--kubeconfig", self.kubeconfig(account)]
        argv = [f"{a.split('=')[0]}=127.0.0.1:0"
                if a.startswith(("--listen=", "--metrics-listen=")) else a for a in argv]
        return argv, env

    def migration_job(self) -> tuple[list[str], dict[str, str]]:
        [c] = pod_spec(find(self.objects, "Job", "controlplane-db-upgrade"))["containers"]
        env = self.env(c, {})
        return container_command(c, env), env

    def agent(self, node: str) -> tuple[list[str], dict[str, str]]:
        daemonset = find(self.objects, "DaemonSet", "checkpoint-agent")
        c = container(daemonset, "agent")
        env = container_env(self.objects, c, {"spec.nodeName": node,
                                              "status.hostIP": "127.0.0.1"})
        argv = container_command(c, env)
        assert f"--node={node}" in argv
        account = pod_spec(daemonset)["serviceAccountName"]
        work = self.tmp / "work" / node
        argv = [("--dumper=sim" if a == "--dumper=kubelet" else
                 f"--workdir={work}" if a.startswith("--workdir=") else a) for a in argv]
        return [*argv, "--kubeconfig", self.kubeconfig(account)], env

    def stop(self) -> None:
        """SIGTERM everything (as the kubelet does), then wait; record the exit codes."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self.exit_codes.setdefault(name, proc.returncode)
            if proc.stdout is not None:
                proc.stdout.close()
