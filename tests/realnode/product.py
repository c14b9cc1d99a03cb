"""The product on real nodes: the real-node world plus our node agents, worker and cpctl.

:func:`open_product_world` takes :func:`tests.support.realnode.open_realnode_world` (an
envtest API server, two kubelets + CRI-O, a loopback registry) and adds, all real and on
loopback: the real kube-scheduler and controller manager (restore pods are placed by
required node affinity; the registration taint ``node.kubernetes.io/not-ready`` is
lifted once, as the node lifecycle controller would); one node agent per node with the
``kubelet`` dumper (the kubelet's checkpoint API with a token the API server authorizes,
its serving certificate checked against the world's CA, the node's checkpoint directory,
its cgroups for the quiesce, its CRI-O socket to pre-pull base images); one
``cpctl worker`` on SQLite; ``cpctl`` verbs as subprocesses.

It also gives the tests of ``tests/realnode/test_product_*.py`` their common judgement
of what the runtime did: a container's log with the runtime's own time on each line
(:meth:`ProductWorld.timed_ticks`), waiting until a restored process has printed a line of
its own (:meth:`ProductWorld.counting_since`), and the shapes a restored log may take
(:func:`consecutive` for a quiesced capture, :func:`went_on` for one that kept
running), and a base image of a test's own that it can then delete from the registry
(:func:`push_base`, :func:`delete_manifest`: a target that cannot pull it cannot restore).
Each agent runs ``crictl`` through a wrapper that a test can hold at the start of a
``pull`` (:meth:`ProductWorld.holding_pulls`), to order the agent's pull of a base image
after the kubelet's first try of a restore.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from drivers.realnode import images
from tests.e2e.world import World
from tests.support.envtest import ADMIN_TOKEN
from tests.support.pump import pump_to_file
from tests.support.realnode import (
    RealNodeWorld,
    Tick,
    counter_command,
    open_realnode_world,
    ticks,
)
from tests.support.waiting import wait_for

TimedTick = tuple[float, Tick]  # (the runtime's time of the line, epoch seconds; the tick)


def consecutive(log: Sequence[Tick]) -> None:
    """One token, counts 1, 2, 3... with no repeat and no gap: the log of a process
    restored from a quiesced capture (the archived lines, then its own)."""
    assert log, "no ticks"
    assert len({token for _, token in log}) == 1, f"more than one life: {log[:3]}..."
    counts = [count for count, _ in log]
    assert counts == list(range(1, len(counts) + 1)), f"repeat or gap in {counts}"


def went_on(log: Sequence[TimedTick], between: float) -> tuple[list[Tick], list[Tick]]:
    """A log restored from a capture that left the source running, split at ``between``
    (a time after the capture, before the restore): the archived lines (1..m, the source's
    output up to the copy of its log, which may be a few lines past CRIU's dump) and the
    restored process's own (consecutive from a count c, 2 <= c <= m + 1: the dumped
    process's next line), all with one token. Fails otherwise."""
    assert log, "no ticks"
    archived = [t for stamp, t in log if stamp <= between]
    own = [t for stamp, t in log if stamp > between]
    every = archived + own
    assert len({token for _, token in every}) == 1, f"more than one life: {every[:3]}..."
    counts = [count for count, _ in archived]
    assert counts == list(range(1, len(counts) + 1)), f"archived: {counts}"
    if own:
        start = own[0][0]
        assert 2 <= start <= len(counts) + 1, f"went on from {start} after 1..{len(counts)}"
        assert [c for c, _ in own] == list(range(start, start + len(own))), \
            f"repeat or gap after the restore: {[c for c, _ in own]}"
    return archived, own


@dataclass
class ProductWorld(World):
    nodes: RealNodeWorld | None = None
    logs: dict[str, Path] = field(default_factory=dict)

    @property
    def real(self) -> RealNodeWorld:
        assert self.nodes is not None
        return self.nodes

    @property
    def repository(self) -> str:
        return f"{self.real.registry}/checkpoints"

    def start(self, name: str, *args: str,
              env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Start a process; its stdout (its log) goes on to ``<name>.stdout`` after the
        first line, read by the caller (an unread pipe would fill and stall it)."""
        proc = super().start(name, *args, env=env)
        assert proc.stdout is not None
        first = proc.stdout.readline() if name.startswith("agent-") else ""
        target = self.tmp / f"{name}.stdout"
        target.write_text(first)
        pump_to_file(proc, target, name)
        return proc

    def cluster_args(self) -> list[str]:
        return ["--kubeconfig", str(self.kubeconfig)]  # the registry over HTTP (loopback)

    def start_counter(self, name: str, node: str, *, at_least: int = 5) -> list[tuple[int, str]]:
        """A counter pod on ``node``, once it has ticked ``at_least`` times; its ticks."""
        self.real.create_pod(name, node, command=counter_command())
        self.real.wait_running(name)
        return wait_for(lambda: t if len(t := ticks(self.real.container_log(name))) >=
                        at_least else None, f"{name} to tick {at_least} times")

    def timed_ticks(self, name: str, node: str, container: str = "main") -> list[TimedTick]:
        """The container's ticks with the time the runtime logged each
        (``/containerLogs?timestamps=true`` from the node's kubelet)."""
        body = self.real.kubelet(node, "GET", f"/containerLogs/{self.namespace}/{name}/"
                                 f"{container}?timestamps=true").decode(errors="replace")
        out = []
        for line in body.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                stamp = datetime.fromisoformat(parts[0][:26].rstrip("Z") + "+00:00")
                out.append((stamp.timestamp(), (int(parts[1]), parts[2])))
        return out

    def counting_since(self, name: str, node: str, since: float, *, container: str = "main",
                       lines: int = 3, limit: float = 60) -> list[Tick]:
        """The container's ticks once it has printed ``lines`` of them after ``since``
        (epoch seconds, e.g. when the operation ended): a restored log begins with the
        archived lines, so only lines logged after the operation are the restored
        process's own."""
        def after() -> list[Tick] | None:
            timed = self.timed_ticks(name, node, container)
            return [t for _, t in timed] if sum(s > since for s, _ in timed) >= lines \
                else None
        return wait_for(after, f"{name}/{container} on {node} counting after {since:.1f}",
                        limit)

    def create_counters(self, name: str, node: str, containers: Sequence[str], *,
                        labels: dict[str, str] | None = None) -> None:
        """A pod on ``node`` (``spec.nodeName``) with one counter per container name."""
        spec = [{"name": c, "image": self.real.image, "command": counter_command()}
                for c in containers]
        self.kube.request("POST", f"/api/v1/namespaces/{self.namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {"app": name}},
            "spec": {"nodeName": node, "containers": spec, "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": 0}})

    def checkpoints_left(self) -> dict[str, list[str]]:
        """What is in each node's kubelet checkpoint directory (the agent takes every
        archive the kubelet writes: empty after any capture)."""
        return {n: sorted(p.name for p in self.real.node(n).settings.checkpoints.iterdir())
                for n in self.real.names}

    def history(self, operation: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = json.loads(self.ok("history", operation, "-o", "json",
                                                          cluster=False))
        return events

    def ticking(self, name: str, container: str = "main", *, at_least: int = 5) -> list[Tick]:
        """The container's ticks once it has printed ``at_least`` of them."""
        return wait_for(lambda: t if len(t := ticks(self.real.container_log(name, container)))
                        >= at_least else None, f"{name}/{container} to tick {at_least} times")

    @contextlib.contextmanager
    def holding_pulls(self, node: str) -> Iterator[Callable[[], None]]:
        """Hold the agent of ``node`` at the start of its next ``crictl pull``s until the
        block ends; yields a call that returns once a pull is held."""
        gate = self.tmp / "gated" / f"pull-{node}"
        held = gate.with_suffix(".held")
        held.unlink(missing_ok=True)
        gate.touch()

        def until_held() -> None:
            wait_for(held.exists, f"the agent of {node} to pull", 120)
        try:
            yield until_held
        finally:
            gate.unlink()

    def running_on(self, name: str, node: str, limit: float = 120) -> dict[str, object]:
        def found() -> dict[str, object] | None:
            pod = self.real.pod(name)
            if pod is None or pod["spec"].get("nodeName") != node or \
                    (pod.get("status") or {}).get("phase") != "Running":
                return None
            return pod
        return wait_for(found, f"{name} running on {node}", limit)


def _start_product(w: ProductWorld, tmp: Path) -> None:
    real = w.real
    token = tmp / "agent-token"
    token.write_text(ADMIN_TOKEN)  # AlwaysAllow: the API server authorizes nodes/checkpoint
    handoff_key = tmp / "handoff.key"  # the agents' shared key (lazy migrations hand over)
    handoff_key.touch(mode=0o600)
    handoff_key.write_bytes(os.urandom(32))
    assert real.nodes.pki is not None
    for name in real.names:
        s = real.node(name).settings
        crictl = _gated_crictl(tmp / "gated", name, s.binaries / "crictl")
        w.start(f"agent-{name}", "drivers.agent", "--node", name,
                        "--kubeconfig", str(w.kubeconfig), "--dumper", "kubelet",
                        "--kubelet-url", real.kubelet_url(name),
                        "--kubelet-token-file", str(token),
                        "--kubelet-ca", str(real.nodes.pki.ca_cert),
                        "--checkpoint-dir", str(s.checkpoints),
                        "--kubelet-checkpoint-dir", str(s.checkpoints),
                        "--cri-endpoint", f"unix://{s.crio_socket}",
                        "--crictl", str(crictl),
                        "--crio-root", str(s.folder / "crio" / "storage"),
                        "--runc-root", str(s.folder / "runc"),
                        "--criu", os.environ.get("CONTROLPLANE_CRIU") or "criu",
                        "--handoff-key", str(handoff_key), "--handoff-listen", "127.0.0.1:0",
                        "--workdir", str(tmp / "work" / name))
        assert (tmp / f"agent-{name}.stdout").read_text(), w.stderr(f"agent-{name}")
    w.ok("db", "upgrade", cluster=False)
    w.start("worker", "controlplane.cli.main", "--db", w.db, "worker", "--poll-seconds",
            "0.05", *w.cluster_args())


_GATED_CRICTL = """#!/bin/sh
# crictl, held at the start of a pull while {gate} exists (tests/realnode/product.py)
case " $* " in *" pull "*)
  if [ -e {gate} ]; then
    : > {gate}.held
    while [ -e {gate} ]; do sleep 0.05; done
  fi ;;
esac
exec {real} "$@"
"""


def _gated_crictl(folder: Path, node: str, real: Path) -> Path:
    folder.mkdir(exist_ok=True)
    wrapper = folder / f"crictl-{node}"
    wrapper.write_text(_GATED_CRICTL.format(gate=folder / f"pull-{node}", real=real))
    wrapper.chmod(0o755)
    return wrapper


@contextlib.contextmanager
def open_product_world(tmp: Path) -> Iterator[ProductWorld]:
    with open_realnode_world(tmp / "real") as real:
        real.envtest.start_controllers()
        for name in real.names:  # the node lifecycle controller's job, which we do not run
            real.kube.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}},
                              content_type="application/merge-patch+json")
        world = ProductWorld("realnode", tmp, real.kubeconfig, real.kube, lambda: None,
                             db=f"sqlite:///{tmp / 'cp.db'}", nodes=real)
        try:
            _start_product(world, tmp)
            yield world
        finally:
            world.stop()


def restored_status(pod: dict[str, Any], repository: str) -> None:
    """The API server's view of a pod CRI-O restored: Running, every container running
    from a checkpoint image in ``repository`` (pinned by digest), never restarted."""
    status = pod.get("status") or {}
    assert status.get("phase") == "Running", status
    images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
    statuses = status.get("containerStatuses") or []
    assert {s["name"] for s in statuses} == set(images), statuses
    for s in statuses:
        assert "running" in s["state"], s
        assert s["restartCount"] == 0, s
        assert images[s["name"]].startswith(f"{repository}@sha256:"), images


def push_base(w: ProductWorld, repository: str) -> str:
    """Busybox under ``repository:v1``, an image of this test's own (its config names
    the repository, so no node holds it already under the world's busybox ID)."""
    layer = images.blob_of(images.rootfs_tar(
        {"bin/busybox": images.BUSYBOX},
        links={f"bin/{a}": "busybox" for a in images.APPLETS},
        dirs=("bin", "tmp", "proc", "sys", "dev", "etc")))
    return images.push_image(w.real.registry, repository, "v1", [layer],
                             config={"Cmd": ["/bin/sh"],
                                     "Env": ["PATH=/bin", f"IMAGE={repository}"]})


def start_on_own_base(w: ProductWorld, name: str, command: Sequence[str], *,
                      base_gone: bool = False) -> tuple[dict[str, Any], list[Tick]]:
    """A pod ``name`` on node-a running ``command`` on a base image of its own
    (:func:`push_base`: node-b does not hold it), once it ticks: the pod and its ticks.
    ``base_gone``: the base is then deleted from the registry (node-b cannot pull it)."""
    w.real.create_pod(name, "node-a", image=push_base(w, f"own/{name}"), command=list(command))
    running = w.real.wait_running(name)
    before = w.ticking(name)
    if base_gone:
        delete_manifest(w, running["status"]["containerStatuses"][0]["imageID"])
    return running, before


def delete_manifest(w: ProductWorld, image_id: str) -> None:
    """Delete ``registry/repo@sha256:...`` from the registry (the image is then gone)."""
    name, _, digest = image_id.partition("@")
    repository = name.split("/", 1)[1]
    request = urllib.request.Request(
        f"http://{w.real.registry}/v2/{repository}/manifests/{digest}", method="DELETE")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 202, answer.status
