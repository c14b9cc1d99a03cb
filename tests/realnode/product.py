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
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.world import World
from tests.support.envtest import ADMIN_TOKEN
from tests.support.realnode import RealNodeWorld, counter_command, open_realnode_world, ticks
from tests.support.waiting import wait_for


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

    def start(self, name: str, *args: str) -> subprocess.Popen[str]:
        """Start a process; its stdout (its log) goes on to ``<name>.stdout`` after the
        first line, read by the caller (an unread pipe would fill and stall it)."""
        proc = super().start(name, *args)
        assert proc.stdout is not None
        first = proc.stdout.readline() if name.startswith("agent-") else ""
        stream, target = proc.stdout, self.tmp / f"{name}.stdout"
        target.write_text(first)

        def copy() -> None:
            with target.open("a") as out, contextlib.suppress(ValueError, OSError):
                for line in stream:
                    out.write(line)
                    out.flush()

        threading.Thread(target=copy, daemon=True, name=f"log-{name}").start()
        return proc

    def cluster_args(self) -> list[str]:
        return ["--kubeconfig", str(self.kubeconfig)]  # the registry over HTTP (loopback)

    def start_counter(self, name: str, node: str, *, at_least: int = 5) -> list[tuple[int, str]]:
        """A counter pod on ``node``, once it has ticked ``at_least`` times; its ticks."""
        self.real.create_pod(name, node, command=counter_command())
        self.real.wait_running(name)
        return wait_for(lambda: t if len(t := ticks(self.real.container_log(name))) >=
                        at_least else None, f"{name} to tick {at_least} times")

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
    assert real.nodes.pki is not None
    for name in real.names:
        s = real.node(name).settings
        w.start(f"agent-{name}", "drivers.agent", "--node", name,
                        "--kubeconfig", str(w.kubeconfig), "--dumper", "kubelet",
                        "--kubelet-url", real.kubelet_url(name),
                        "--kubelet-token-file", str(token),
                        "--kubelet-ca", str(real.nodes.pki.ca_cert),
                        "--checkpoint-dir", str(s.checkpoints),
                        "--kubelet-checkpoint-dir", str(s.checkpoints),
                        "--cri-endpoint", f"unix://{s.crio_socket}",
                        "--crictl", str(s.binaries / "crictl"),
                        "--workdir", str(tmp / "work" / name))
        assert (tmp / f"agent-{name}.stdout").read_text(), w.stderr(f"agent-{name}")
    w.ok("db", "upgrade", cluster=False)
    w.start("worker", "controlplane.cli.main", "--db", w.db, "worker", "--poll-seconds",
            "0.05", *w.cluster_args())


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
