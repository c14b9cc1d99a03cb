"""Real processes checkpointed with real CRIU: the real-checkpoint tests' world.

:func:`open_criu_world` starts, all on loopback and all real:

- a kube-apiserver of its own (envtest; its own etcd, so its nodes meet no other test's);
- Debian's ``docker-registry``, holding the workload image and the checkpoints;
- the kubelet role with runtime-backed nodes (``cpctl sim nodes --runtime-root``): each
  node a podman storage root, a pod's containers real runc containers;
- one node agent per node with the ``criu`` dumper, one ``cpctl worker``, and ``cpctl``
  verbs as subprocesses (the registry over HTTP, as in a cluster);
- keys, as an install has them: every agent signs what it pushes and restores only
  what a trusted key signed; the classes file holds ``sealed``, a class whose
  checkpoints are encrypted for a recipient whose private key is a file on the nodes,
  and ``streamed``, whose migrations stream between the agents (they share a handoff
  key) with the registry copy pushed beside.

The workload is :mod:`drivers.podman.workload`'s counter, built here and pushed to the
registry. A test reads a container's log from its node's podman. Missing podman, CRIU or
envtest FAIL the test and say which script installs them: these tests are never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from drivers.podman import PodmanNode
from drivers.podman.workload import (
    Resumption,
    Tick,
    build_image,
    command,
    pod_ticks,
    resumption,
)
from tests.criu.gates import Gate, holding, install_gated_podman
from tests.e2e.world import KubeHttp, Obj, World, pinned_pod
from tests.registry.servers import LISTENING, REGISTRY_BIN, require_registry, write_registry_config
from tests.support.envtest import (
    KubeletRole,
    find_real_cluster,
    running_envtest,
    start_kubelet_role,
)
from tests.support.pump import pump_to_file
from tests.support.stopping import stop_processes
from tests.support.waiting import wait_for

NODES = ("node-1", "node-2", "node-3")


def require_runtime() -> None:
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    criu = os.environ.get("CONTROLPLANE_CRIU", "/usr/local/sbin/criu")
    if not os.access(criu, os.X_OK):
        missing.append(f"CRIU 4.1 at {criu}")
    if missing:
        pytest.fail(f"real checkpoints need {', '.join(missing)}: run scripts/ensure-criu "
                    "(`make test` does); these tests are never skipped", pytrace=False)


@dataclass
class CriuWorld(World):
    registry: str = ""  # 127.0.0.1:<port>
    relay: CuttingRelay | None = None  # the registry through a relay that can cut pushes
    image: str = ""
    runtime_root: Path = field(default_factory=Path)
    keys: Path = field(default_factory=Path)
    killed: list[subprocess.Popen[str]] = field(default_factory=list)
    gated_bin: Path = field(default_factory=Path)  # the agents' podman (tests/criu/gates.py)

    @property
    def classes_file(self) -> Path:
        return self.tmp / "classes.yaml"

    def sealed(self) -> list[str]:
        """The flags of a verb using the sealed class."""
        return ["--class", "sealed", "--classes-file", str(self.classes_file)]

    def streamed(self, *, relayed: bool = False) -> list[str]:
        """The flags of a migration whose class streams between agents (plain layers);
        ``relayed``: its registry copy goes through :attr:`relay`."""
        return ["--class", "streamed-relayed" if relayed else "streamed",
                "--classes-file", str(self.classes_file)]

    @property
    def repository(self) -> str:
        return f"{self.registry}/checkpoints"

    @property
    def relayed_repository(self) -> str:
        assert self.relay is not None
        return f"{self.relay.host}/checkpoints"

    def cluster_args(self) -> list[str]:
        return ["--kubeconfig", str(self.kubeconfig)]  # the registry over HTTP (loopback)

    def start(self, name: str, *args: str,
              env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Start a process; once its first line is read, the rest of its stdout (its log)
        goes on to ``<name>.stdout`` (an unread pipe would fill and stall it)."""
        proc = super().start(name, *args, env=env)
        if name == "worker":  # prints no ready line
            self._pump(name, proc)
        return proc

    def _pump(self, name: str, proc: subprocess.Popen[str]) -> None:
        pump_to_file(proc, self.tmp / f"{name}.stdout", name)

    def start_agent(self, node: str, *, workdir: Path | None = None) -> None:
        """Start (or start again) ``node``'s agent; returns once it serves."""
        name = f"agent-{node}"
        agent = self.start(name, "drivers.agent", "--node", node,
                           "--kubeconfig", str(self.kubeconfig), "--dumper", "criu",
                           "--runtime-root", str(self.runtime_root),
                           "--workdir", str(workdir or self.tmp / "work" / node),
                           "--signing-key", str(self.keys / "signing.pem"),
                           "--trusted-key", str(self.keys / "signing.pub"),
                           "--handoff-key", str(self.keys / "handoff.key"),
                           "--handoff-listen", "127.0.0.1:0",
                           env={**os.environ,  # its podman: the gated wrapper (gates.py)
                                "PATH": f"{self.gated_bin}:{os.environ.get('PATH', '')}"})
        assert agent.stdout is not None
        assert agent.stdout.readline(), self.stderr(name)
        self._pump(name, agent)

    def start_worker(self) -> None:
        self.start("worker", "controlplane.cli.main", "--db", self.db, "worker",
                   "--poll-seconds", "0.05", "--trusted-key", str(self.keys / "signing.pub"),
                   # a killed worker's leases lapse soon: the next one takes them over
                   "--lease-seconds", "6", *self.cluster_args())

    def kill(self, name: str) -> None:
        """SIGKILL a process of the world (``worker``, ``agent-node-1``...) and reap it:
        what a node's OOM killer or a lost machine does. Start it again with
        :meth:`start_agent` / :meth:`start_worker`."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait(30)
        self.killed.append(proc)

    def holding(self, node: str, verb: str, name: str) -> contextlib.AbstractContextManager[Gate]:
        """Hold ``node``'s agent's next ``podman container <verb>`` of pod ``name`` at its
        start until the block ends (:mod:`tests.criu.gates`)."""
        return holding(self.gated_bin.parent / "gates", self.runtime_root / node, verb, name)

    def node(self, name: str) -> PodmanNode:
        return PodmanNode(self.runtime_root / name)

    def make_counter(self, name: str, node: str, *, mib: int = 0,
                     labels: dict[str, str] | None = None, seed: int = 0,
                     dirty_mib_per_s: int = 0) -> Obj:
        """A counter pod placed on ``node`` (rewriting ``dirty_mib_per_s`` MiB of its
        memory every second); waits until its container runs."""
        body = pinned_pod(name, node, {"name": "main", "image": self.image,
                                       "command": command(mib, seed=seed,
                                                          dirty_mib_per_s=dirty_mib_per_s)},
                          labels={"app": name, **(labels or {})})
        self.kube.request("POST", f"/api/v1/namespaces/{self.namespace}/pods", body)
        return self.running(name, limit=120)

    def ticks(self, pod: Obj) -> list[Tick]:
        """The counter's ticks as the pod's container logged them, on its node."""
        return asyncio.run(pod_ticks(self.node(pod["spec"]["nodeName"]), pod))

    def containers(self, node: str) -> list[str]:
        return [s.name for s in asyncio.run(self.node(node).states())]


class CuttingRelay:
    """A TCP relay to the registry that, while :attr:`cutting`, drops every connection
    once it has carried ``limit`` bytes towards the registry: the registry going away in
    the middle of a push (small requests, a manifest check, still pass). Between
    :meth:`hold` and :meth:`release` such a connection waits there instead: a push that
    has begun and cannot end, for as long as a test needs it. While
    :attr:`cutting_pulls`, a connection is dropped once ``limit`` bytes came back from
    the registry: the registry going away in the middle of a pull."""

    def __init__(self, upstream: str, *, limit: int = 256 * 1024) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.limit = limit
        self.cutting = False
        self.cuts = 0
        self.cutting_pulls = False
        self.pull_cuts = 0
        self.held = 0  # connections that waited at the limit
        self._open = threading.Event()
        self._open.set()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True, name="relay").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as server:
            sent, received = [0], [0]

            def pump(src: socket.socket, dst: socket.socket, upload: bool) -> None:
                with contextlib.suppress(OSError):
                    while data := src.recv(65536):
                        if upload:
                            sent[0] += len(data)
                            if self.cutting and sent[0] > self.limit:
                                self.cuts += 1
                                break
                            if sent[0] > self.limit and not self._open.is_set():
                                self.held += 1
                                self._open.wait()
                        else:
                            received[0] += len(data)
                            if self.cutting_pulls and received[0] > self.limit:
                                self.pull_cuts += 1
                                break
                        dst.sendall(data)
                for sock in (src, dst):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

            back = threading.Thread(target=pump, args=(server, client, False), daemon=True)
            back.start()
            pump(client, server, True)
            back.join(30)

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def close(self) -> None:
        self.release()
        self._server.close()


@contextlib.contextmanager
def _registry(workdir: Path) -> Iterator[str]:
    require_registry()
    config = write_registry_config(workdir)
    proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    try:
        host = ""
        for line in proc.stdout:
            found = LISTENING.search(line)
            if found:
                host = found.group(1)
                break
        if not host:
            raise RuntimeError("docker-registry exited before listening")
        drain = subprocess.Popen(["cat"], stdin=proc.stdout, stdout=subprocess.DEVNULL)
        yield host
    finally:
        proc.terminate()
        proc.wait(10)
        if "drain" in locals():
            drain.wait(10)
        proc.stdout.close()


def _reset(root: Path) -> None:
    """Remove every container and image of a node root (unmounting what podman mounted)."""
    if root.exists():
        node = PodmanNode(root)
        # Killed at once: `system reset` would stop each running container with a 10 s
        # grace (a counter ignores SIGTERM), half a minute for a world's leftovers.
        subprocess.run([*node.base_args(), "rm", "--all", "--force", "--time", "0"],
                       capture_output=True, timeout=120, check=False)
        subprocess.run([*node.base_args(), "system", "reset", "--force"], capture_output=True,
                       timeout=120, check=False)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(node.runroot, ignore_errors=True)


def _delete_nodes(kube: KubeHttp) -> None:
    for node in NODES:
        with contextlib.suppress(Exception):
            kube.request("DELETE", f"/api/v1/nodes/{node}")


@contextlib.contextmanager
def open_criu_world(tmp: Path) -> Iterator[CriuWorld]:
    require_runtime()
    kind, where = find_real_cluster()
    if kind != "assets":
        pytest.fail(f"the real-checkpoint tests start a kube-apiserver of their own: {where}",
                    pytrace=False)
    runtime_root = tmp / "nodes"
    role: KubeletRole | None = None
    with running_envtest(Path(where), tmp / "envtest") as env, _registry(tmp / "registry") as reg:
        kubeconfig = env.write_kubeconfig(tmp / "admin.kubeconfig")
        keys = write_keys(tmp / "keys")
        world = CriuWorld("criu", tmp, kubeconfig, KubeHttp.from_kubeconfig(kubeconfig),
                          env.restart_apiserver, db=f"sqlite:///{tmp / 'cp.db'}",
                          registry=reg, runtime_root=runtime_root, relay=CuttingRelay(reg),
                          keys=keys, gated_bin=install_gated_podman(tmp / "gated"))
        write_classes(world.classes_file, world.repository, keys,
                      relayed=world.relayed_repository)
        builder = PodmanNode(tmp / "builder")
        try:
            world.image = asyncio.run(build_image(builder, reg, tmp / "image"))
            role = start_kubelet_role(kubeconfig, NODES, tmp / "kubelets.log",
                                      "--runtime-root", str(runtime_root))
            for node in NODES:
                world.start_agent(node)
            world.ok("db", "upgrade", cluster=False)
            world.start_worker()
            yield world
        finally:
            world.stop()
            stop_processes(world.killed)  # closes the pipes of the killed ones
            if world.relay is not None:
                world.relay.close()
            if role is not None:
                role.stop()
            _delete_nodes(world.kube)
            for root in [builder.root, *(runtime_root / n for n in NODES)]:
                _reset(root)


def _pem_pair(private: Any, where: Path, name: str) -> None:
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    (where / f"{name}.pem").write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (where / f"{name}.pem").chmod(0o600)
    (where / f"{name}.pub").write_bytes(private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def write_keys(where: Path) -> Path:
    """``signing.pem/.pub`` (the agents' signing key) and ``recipient.pem/.pub`` (the
    sealed class's recipient), EC P-256 as an install generates them, and
    ``handoff.key``, the agents' shared handoff key."""
    for name in ("signing", "recipient"):
        _pem_pair(ec.generate_private_key(ec.SECP256R1()), where, name)
    handoff = where / "handoff.key"  # the agents' shared key (the checkpoint-handoff Secret)
    handoff.touch(mode=0o600)
    handoff.write_bytes(os.urandom(32))
    return where


def write_classes(path: Path, repository: str, keys: Path, *, relayed: str) -> None:
    """The world's classes: ``sealed``, ``streamed`` and ``streamed-relayed`` (its
    registry copy through the relay at ``relayed``)."""
    path.write_text(json.dumps({"classes": [{
        "name": "sealed", "repository": repository,
        "encryption": {"recipients": [f"file:{keys / 'recipient.pub'}"],
                       "keyFile": str(keys / "recipient.pem")}},
        {"name": "streamed", "repository": repository, "transfer": "stream"},
        {"name": "streamed-relayed", "repository": relayed, "transfer": "stream"}]}))


def resumed(ticks: list[Tick], before: list[Tick], *, quiesced: bool) -> Resumption:
    """The restored log is the checkpointed process going on: it starts with the ticks
    the source printed before the operation, then resumes once, at a count after those,
    with no gap and every page intact (:func:`~drivers.podman.workload.resumption`).

    ``quiesced``: the checkpoint stopped the source, so no count is printed twice — the
    first count on the target is exactly the checkpointed count + 1."""
    assert ticks[:len(before)] == before, "the restored log does not start with the " \
                                          "source's own ticks: not the checkpointed process"
    counts = [t.count for t in ticks]
    found = resumption(ticks)
    assert found is not None, counts
    assert found.checkpointed >= len(before), (found, len(before))
    if quiesced:
        # The dump stops the source and the archive copies its log after that: the log
        # ends at the checkpointed count N and the target goes on from N+1.
        assert counts == list(range(1, len(counts) + 1)), \
            f"a quiesced source printed a count again after its checkpoint: {counts}"
    # Not quiesced (``--leave-running``), the source prints on while the archive is
    # written and may copy its log a few ticks after the dump: the log may count 1..N+k
    # and go on from N+1, the one step back resumption() allows.
    return found


def wait_running_on(w: CriuWorld, app: str, node: str, limit: float = 120) -> Obj:
    def found() -> Obj | None:
        pods = [p for p in w.running_pods(f"app={app}") if p["spec"]["nodeName"] == node]
        return pods[0] if len(pods) == 1 else None
    return wait_for(found, f"{app} running on {node}", limit)
