"""The product as deployed, against the simulator or a real API server: the e2e tests' world.

:func:`open_world` gives a cluster — the simulator (in a thread of this process, with its
in-process scheduler and kubelets, so a test can reach its fault hooks) or the session's
real kube-apiserver (envtest, nodes from the kubelet role ``cpctl sim nodes``) — plus
what an operator runs beside it, as real subprocesses: one node agent per node (the sim
dumper, an on-disk OCI layout), one ``cpctl worker``, and ``cpctl`` verbs.

Tests talk to the cluster only over HTTP(S) with the kubeconfig (:class:`KubeHttp`), the
same on both, and wait on conditions with a deadline (other processes: nothing to await).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from drivers.sim import MARKER, SimCluster
from tests.support.cpctl import in_process
from tests.support.envtest import RealCluster
from tests.support.stopping import stop_processes
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
REPO = "localhost:5000/checkpoints"
IMAGE = "registry.k8s.io/pause:3.9"
NODES = ("node-1", "node-2", "node-3")
Obj = dict[str, Any]


class ApiError(Exception):
    def __init__(self, code: int, body: str) -> None:
        super().__init__(f"{code}: {body[:300]}")
        self.code = code


@dataclass
class KubeHttp:
    """Raw requests to the cluster with a kubeconfig's server, CA and bearer token."""

    server: str
    token: str | None
    context: ssl.SSLContext | None

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeHttp:
        doc = yaml.safe_load(path.read_text())
        cluster = doc["clusters"][0]["cluster"]
        user = doc["users"][0]["user"] if doc.get("users") else {}
        ca = cluster.get("certificate-authority")
        context = ssl.create_default_context(cafile=ca) if ca else None
        return cls(cluster["server"].rstrip("/"), user.get("token"), context)

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=15, context=self.context) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            with exc:  # it holds the response and its socket
                raise ApiError(exc.code, exc.read().decode(errors="replace")) from None

    def pods(self, namespace: str, selector: str | None = None) -> list[Obj]:
        query = f"?labelSelector={selector}" if selector else ""
        items: list[Obj] = self.request("GET", f"/api/v1/namespaces/{namespace}/pods{query}")[
            "items"]
        return items

    def pod(self, namespace: str, name: str) -> Obj | None:
        try:
            found: Obj = self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
            return found
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise




def pinned_pod(name: str, node: str, container: Obj, *, labels: Mapping[str, str],
               annotations: Mapping[str, str] | None = None) -> Obj:
    """A one-container pod placed on ``node`` by required node affinity."""
    return {"metadata": {"name": name, "labels": dict(labels),
                         "annotations": dict(annotations or {})},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 1,
                     "affinity": {"nodeAffinity": {
                         "requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [{
                                 "key": "kubernetes.io/hostname", "operator": "In",
                                 "values": [node]}]}]}}}}}


class SimInThread:
    """A :class:`SimCluster` served by an event loop in a thread of this process."""

    def __init__(self, tmp: Path) -> None:
        self.kubeconfig = tmp / "sim.kubeconfig"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sim", daemon=True)
        self._thread.start()
        self.cluster: SimCluster = self.call(self._start)

    async def _start(self) -> SimCluster:
        cluster = SimCluster(nodes=list(NODES))
        await cluster.__aenter__()
        cluster.write_kubeconfig(self.kubeconfig)
        return cluster

    def call(self, make: Callable[[], Any]) -> Any:
        """Run ``make()`` (a coroutine function or a plain one) on the simulator's loop."""
        async def run() -> Any:
            result = make()
            return await result if asyncio.iscoroutine(result) else result
        future: Future[Any] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(30)

    def stop(self) -> None:
        self.call(lambda: self.cluster.__aexit__(None, None, None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@dataclass
class World:
    kind: str
    tmp: Path
    kubeconfig: Path
    kube: KubeHttp
    restart: Callable[[], None]
    namespace: str = "default"
    db: str = ""
    layout: Path = field(default_factory=Path)
    procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict)

    def name(self, base: str) -> str:
        return f"{base}-{uuid.uuid4().hex[:5]}"

    def start(self, name: str, *args: str,
              env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        with (self.tmp / f"{name}.stderr").open("a") as err:  # a restart appends
            proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, text=True,
                                    stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL, env=env)
        self.procs[name] = proc
        return proc

    def stderr(self, name: str) -> str:
        return (self.tmp / f"{name}.stderr").read_text(errors="replace")

    def cluster_args(self) -> list[str]:
        return ["--kubeconfig", str(self.kubeconfig), "--registry-layout", str(self.layout)]

    def cpctl(self, *args: str, cluster: bool = False) -> subprocess.CompletedProcess[str]:
        extra = self.cluster_args() if cluster else []
        return subprocess.run([sys.executable, "-m", "controlplane.cli.main", "--db", self.db,
                               *args, *extra], cwd=ROOT, capture_output=True, text=True,
                              timeout=180, stdin=subprocess.DEVNULL)

    def ok(self, *args: str, cluster: bool = True) -> str:
        """Run a cluster verb; it must exit 0. Returns its stdout."""
        done = self.cpctl(*args, cluster=cluster)
        assert done.returncode == 0, f"cpctl {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def get(self, operation: str) -> Obj:
        """``cpctl get -o json``, run by ``main`` in this process where no event loop
        runs in this thread: the tests poll it, and a ``cpctl`` process per poll cost half
        a CPU second each, on a machine whose two cores the whole suite shares. (The
        verbs that act stay real processes: :meth:`ok`.)"""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            done = in_process(self.db, "get", operation, "-o", "json")
            assert done.returncode == 0, f"cpctl get {operation}: {done.stdout}{done.stderr}"
            got: Obj = json.loads(done.stdout)
            return got
        got = json.loads(self.ok("get", operation, "-o", "json", cluster=False))
        return got

    def phase_of(self, operation: str) -> str:
        return str(self.get(operation)["phase"])

    def wait_phase(self, operation: str, *phases: str, limit: float = 90) -> str:
        return wait_for(lambda: p if (p := self.phase_of(operation)) in phases else None,
                        f"{operation} in {phases}", limit, every=0.2)

    def make_pod(self, name: str, node: str, *, marker: str | None = None,
                 labels: Mapping[str, str] | None = None, cpu: str | None = None) -> Obj:
        """A pod placed on ``node`` by required node affinity; waits until it runs."""
        container: Obj = {"name": "main", "image": IMAGE}
        if cpu:
            container["resources"] = {"requests": {"cpu": cpu}}
        body = pinned_pod(name, node, container, labels={"e2e": "verbs", **(labels or {})},
                          annotations={MARKER: marker} if marker else {})
        self.kube.request("POST", f"/api/v1/namespaces/{self.namespace}/pods", body)
        return self.running(name)

    def running(self, name: str, limit: float = 60) -> Obj:
        def check() -> Obj | None:
            pod = self.kube.pod(self.namespace, name)
            return pod if pod and (pod.get("status") or {}).get("phase") == "Running" else None
        return wait_for(check, f"{self.namespace}/{name} running", limit)

    def running_pods(self, selector: str) -> list[Obj]:
        return [p for p in self.kube.pods(self.namespace, selector)
                if (p.get("status") or {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")]

    def delete_pod(self, name: str) -> None:
        with contextlib.suppress(ApiError):
            self.kube.request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{name}",
                              {"gracePeriodSeconds": 0})

    @contextlib.contextmanager
    def paused(self, agent_node: str) -> Iterator[None]:
        """The node's agent stopped (SIGSTOP): captures and restores there wait."""
        proc = self.procs[f"agent-{agent_node}"]
        proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        stop_processes(self.procs.values())


def _start_product(world: World) -> None:
    """Node agents on every node, the schema, and one worker, as subprocesses."""
    for node in NODES:
        agent = world.start(f"agent-{node}", "drivers.agent", "--node", node,
                            "--kubeconfig", str(world.kubeconfig), "--layout",
                            str(world.layout), "--dumper", "sim", "--workdir",
                            str(world.tmp / "work" / node))
        assert agent.stdout is not None
        assert agent.stdout.readline(), world.stderr(f"agent-{node}")  # serving
    world.ok("db", "upgrade", cluster=False)
    world.start("worker", "controlplane.cli.main", "--db", world.db, "worker",
                "--poll-seconds", "0.05", *world.cluster_args())


@contextlib.contextmanager
def open_world(kind: str, tmp: Path, real: RealCluster | None) -> Iterator[World]:
    sim: SimInThread | None = None
    if kind == "sim":
        sim = SimInThread(tmp)
        kubeconfig = sim.kubeconfig
        cluster = sim.cluster

        def restart() -> None:
            # The simulator's stand-in for an API server restart: every watch ends, and
            # the history they would resume from is compacted (their resume meets 410).
            sim.call(lambda: (cluster.faults.compact(), cluster.faults.expire_watches()))
    else:
        assert real is not None
        kubeconfig = real.kubeconfig
        restart = real.restart_apiserver
    world = World(kind, tmp, kubeconfig, KubeHttp.from_kubeconfig(kubeconfig), restart,
                  db=f"sqlite:///{tmp / 'cp.db'}", layout=tmp / "oci")
    try:
        _start_product(world)
        yield world
    finally:
        world.stop()
        for pod in world.kube.pods(world.namespace, "e2e=verbs"):
            world.delete_pod(pod["metadata"]["name"])
        if sim is not None:
            sim.stop()
