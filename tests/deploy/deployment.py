"""The manifests' processes on one machine: what the kubelet would start, started here.

:class:`DeployedRun` renders an overlay and runs, as real subprocesses against a cluster
and a real OCI registry (Debian's ``docker-registry``) on loopback: the migration Job's
container, the Deployment's init container, its worker container once per replica and
its API container, and the DaemonSet's container once per node — each with the command,
args and environment the rendered objects give it (:mod:`tests.deploy.manifests`). Only
what cannot exist off-cluster is substituted, and each substitution is listed in
:data:`SUBSTITUTIONS`. Each component connects with a kubeconfig for its ServiceAccount.

The cluster is either :class:`Simulator` (``cpctl sim up``: the bearer token names the
ServiceAccount, ``system:serviceaccount:<ns>:<name>``, and the simulator's audit says who
made which call; tests/deploy/test_deployed.py) or :class:`RealServer` (a real
kube-apiserver: its URL, CA and a token per ServiceAccount that it authenticates as that
account; tests/deploy/test_rbac_real.py).
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import yaml

from tests.deploy.manifests import (
    ROOT,
    Obj,
    all_of,
    container,
    container_command,
    container_env,
    find,
    pod_spec,
)
from tests.support.envtest import write_kubeconfig
from tests.support.waiting import wait_for

NAMESPACE = "checkpoint-system"
REGISTRY_BIN = "/usr/bin/docker-registry"
SUBSTITUTIONS = {
    "--in-cluster": "--kubeconfig <the component's kubeconfig: its ServiceAccount's token>",
    "--dumper=kubelet": "--dumper=sim (no kubelet: it captures through pod annotations)",
    "--workdir=...": "a temporary directory per node (an emptyDir in the cluster)",
    "--listen=0.0.0.0:8080": "--listen=127.0.0.1:0 (any free port)",
    "--metrics-listen=0.0.0.0:9090": "--metrics-listen=127.0.0.1:0 (any free port)",
    "secret controlplane-database/url": "the test's database URL",
    "cpctl / python": "this interpreter (-m controlplane.cli.main)",
    "downward API": "metadata.name = <deployment>-<i>, spec.nodeName = the node, "
                    "status.hostIP = 127.0.0.1",
    "configMap volumes": "the ConfigMap's files written to a temporary directory, and "
                         "environment values under the mount path pointed there",
}


def service_account_user(name: str, namespace: str = NAMESPACE) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def granted(objects: list[Obj], user: str) -> set[Grant]:
    """What the rendered ClusterRoles (and Roles) bound to ``user`` allow."""
    grants: set[Grant] = set()
    bindings = [*all_of(objects, "ClusterRoleBinding"), *all_of(objects, "RoleBinding")]
    for binding in bindings:
        subjects = {service_account_user(s["name"], s["namespace"])
                    for s in binding.get("subjects") or [] if s["kind"] == "ServiceAccount"}
        if user not in subjects:
            continue
        role = find(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for rule in role["rules"]:
            assert "*" not in rule["verbs"], rule
            assert "*" not in rule["resources"], rule
            grants |= {(g, res, v) for g in rule["apiGroups"] for res in rule["resources"]
                       for v in rule["verbs"]}
    return grants


async def empty_schema(url: str) -> None:
    """The session's PostgreSQL database, emptied: the migration Job starts from nothing."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
    finally:
        await conn.close()




class Cluster(Protocol):
    """Where the components connect, and how the test makes its own requests."""

    def kubeconfig(self, service_account: str, folder: Path) -> str:
        """A kubeconfig that authenticates as ``service_account`` (in :data:`NAMESPACE`)."""
        ...

    def api(self, path: str, body: Obj | None = None) -> Any:
        """GET ``path`` (POST ``body``) as the test itself, not as any component."""
        ...


@dataclass(frozen=True)
class Simulator:
    """``cpctl sim up``: it accepts any token and records it as the caller's user name."""

    url: str
    kubeconfig_template: Path

    def kubeconfig(self, service_account: str, folder: Path) -> str:
        config = yaml.safe_load(self.kubeconfig_template.read_text())
        config["users"][0]["user"]["token"] = service_account_user(service_account)
        path = folder / f"{service_account}.kubeconfig"
        path.write_text(json.dumps(config))
        return str(path)

    def api(self, path: str, body: Obj | None = None) -> Any:
        # No token: the audit attributes these requests to no component.
        return _request(self.url + path, body, headers={}, context=None)


@dataclass(frozen=True)
class RealServer:
    """A real kube-apiserver: each ServiceAccount's bearer token, and the admin's for the
    test's own requests (``tokens`` maps a ServiceAccount of :data:`NAMESPACE` to a token
    the server authenticates as that account)."""

    url: str
    ca_file: Path
    admin_token: str
    tokens: Mapping[str, str]

    def kubeconfig(self, service_account: str, folder: Path) -> str:
        return str(write_kubeconfig(folder / f"{service_account}.kubeconfig", self.url,
                                    self.ca_file, self.tokens[service_account],
                                    user=service_account_user(service_account)))

    def api(self, path: str, body: Obj | None = None) -> Any:
        return _request(self.url + path, body,
                        headers={"Authorization": f"Bearer {self.admin_token}"},
                        context=ssl.create_default_context(cafile=str(self.ca_file)))


def _request(url: str, body: Obj | None, *, headers: dict[str, str],
             context: ssl.SSLContext | None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST" if body else "GET",
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=10, context=context) as resp:
        return json.loads(resp.read())


@dataclass
class DeployedRun:
    objects: list[Obj]
    tmp: Path
    db_url: str
    cluster: Cluster | None = None
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
        self.cluster = Simulator(sim.stdout.readline().split("listening on ")[1].split()[0],
                                 base)

    def kubeconfig(self, service_account: str) -> str:
        assert self.cluster is not None, "no cluster: start_simulator() or pass cluster="
        return self.cluster.kubeconfig(service_account, self.tmp)

    def api(self, path: str, body: Obj | None = None) -> Any:
        """The test's own request to the cluster (not attributed to any component)."""
        assert self.cluster is not None, "no cluster: start_simulator() or pass cluster="
        return self.cluster.api(path, body)

    def list_pods(self, namespace: str) -> list[Obj]:
        items: list[Obj] = self.api(f"/api/v1/namespaces/{namespace}/pods")["items"]
        return items

    def running(self, namespace: str, count: int) -> None:
        """Wait until ``count`` pods of ``namespace`` run (the kubelets are elsewhere)."""
        wait_for(lambda: len([p for p in self.list_pods(namespace)
                              if (p.get("status") or {}).get("phase") == "Running"]) == count,
                 f"{count} pods running in {namespace}")

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
        env = self.mounted(deployment, c, self.env(c, {"metadata.name": f"controlplane-{replica}"}))
        argv = container_command(c, env)
        account = pod_spec(deployment)["serviceAccountName"]
        if "--in-cluster" in argv:
            i = argv.index("--in-cluster")
            argv[i:i + 1] = ["--kubeconfig", self.kubeconfig(account)]
        argv = [f"{a.split('=')[0]}=127.0.0.1:0"
                if a.startswith(("--listen=", "--metrics-listen=")) else a for a in argv]
        return argv, env

    def mounted(self, workload: Obj, c: Obj, env: dict[str, str]) -> dict[str, str]:
        """The container's configMap volumes as the kubelet projects them (one file per
        key), here in a temporary directory; environment values naming a file under a
        mount path (``CONTROLPLANE_CLASSES_FILE``) point at the projected copy."""
        volumes = {v["name"]: v for v in pod_spec(workload).get("volumes") or []}
        for mount in c.get("volumeMounts") or []:
            source = volumes[mount["name"]].get("configMap")
            if source is None:
                continue
            folder = self.tmp / "volumes" / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            for key, value in (find(self.objects, "ConfigMap", source["name"])
                               .get("data") or {}).items():
                (folder / key).write_text(str(value))
            prefix = mount["mountPath"].rstrip("/") + "/"
            env = {k: str(folder) + "/" + v[len(prefix):] if v.startswith(prefix) else v
                   for k, v in env.items()}
        return env

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

    def start_control_plane(self, nodes: tuple[str, ...], *, api: bool = True) -> None:
        """What ``kubectl apply -k`` starts, in the order the cluster would get there: the
        migration Job, the init container's gate, an agent per node, every worker replica,
        and (``api``) the API container, whose URL lands in :attr:`api_url`."""
        argv, env = self.migration_job()
        job = self.run(argv, env)
        assert job.returncode == 0, job.stderr
        argv, env = self.control_plane("wait-for-schema", 0)
        gate = self.run(argv, env)
        assert gate.returncode == 0, gate.stdout + gate.stderr
        assert "up to date" in gate.stdout
        agents = {node: self.start(f"agent-{node}", *self.agent(node)) for node in nodes}
        for node, agent in agents.items():  # started together: each takes seconds to import
            assert agent.stdout is not None
            assert agent.stdout.readline().startswith("node agent serving"), \
                self.stderr(f"agent-{node}")[-2000:]
        replicas = find(self.objects, "Deployment", "controlplane")["spec"]["replicas"]
        for i in range(replicas):
            argv, env = self.control_plane("worker", i)
            self.start(f"worker-{i}", argv, env)
        if api:
            argv, env = self.control_plane("api", 0)
            proc = self.start("api", argv, env)
            assert proc.stdout is not None
            self.api_url = proc.stdout.readline().split(" on ")[1].strip().rstrip("/")

    def in_worker(self, *verb: str) -> subprocess.CompletedProcess[str]:
        """``kubectl exec deploy/controlplane -c worker -- cpctl VERB...``: a verb run with
        the worker container's environment and identity (docs/install.md, step 7)."""
        argv, env = self.control_plane("worker", 0)
        kubeconfig = argv[argv.index("--kubeconfig") + 1]
        return self.run([*argv[:argv.index("worker")], *verb, "--kubeconfig", kubeconfig],
                        env)

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
