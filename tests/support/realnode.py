"""Real nodes for the tests: an envtest API server and two kubelets + CRI-O, all real.

:func:`open_realnode_world` starts, on loopback (``drivers.realnode`` does the nodes):
a kube-apiserver of its own (envtest: its own etcd, token auth, ``AlwaysAllow``) that
reaches the kubelets by node name; the loopback registry holding the pause image and a
busybox test image; two Ready nodes, ``node-a`` and ``node-b`` (a kubelet v1.36 and a
CRI-O 1.36 each, CRIU 4.1). :func:`realnode_world` is the same as a session-scoped
fixture (a conftest imports it), since bringing nodes up costs seconds.

:class:`RealNodeWorld` gives tests the pieces and the moves an end-to-end test needs:
pods placed on a node (``spec.nodeName``: no scheduler runs), a container's log through
the kubelet API or from its file, the kubelet checkpoint API, a checkpoint image pushed
to the registry, an image pre-pulled on a node, and what the world would leave on the
host (:meth:`RealNodeWorld.leftovers`, empty after :meth:`RealNodeWorld.close`).

Without ``$CONTROLPLANE_REALNODE`` (``scripts/ensure-realnode`` found no
``../shared/realnode``) a test SKIPS with one line saying how to enable it; with it,
anything missing or failing to start FAILS.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from drivers.realnode import (
    HOW_TO_ENABLE,
    RealNode,
    RealNodes,
    binaries_folder,
    host,
    images,
)
from tests.e2e.world import KubeHttp
from tests.support.envtest import (
    ADMIN_TOKEN,
    ASSETS,
    Envtest,
    Identity,
    find_real_cluster,
    running_envtest,
)
from tests.support.envtest import HOW_TO_ENABLE as HOW_TO_ENABLE_ENVTEST
from tests.support.waiting import wait_for

NODES = ("node-a", "node-b")
NAMESPACE = "default"
Obj = dict[str, Any]


def counter_command(interval: str = "0.1") -> list[str]:
    """A shell loop printing ``<count> <token>`` once per ``interval`` seconds: 1, 2, 3...
    and a random token drawn once when the shell starts. Both live only in the shell's
    memory: a restored container goes on with the same token from the checkpointed count,
    a restarted one starts a new token at 1."""
    return ["/bin/sh", "-c", "t=$RANDOM$RANDOM; i=0; "
            f'while true; do i=$((i+1)); echo "$i $t"; sleep {interval}; done']


Tick = tuple[int, str]  # (count, token)


def ticks(log: str) -> list[Tick]:
    """A counter's lines in a log (other lines ignored)."""
    found = []
    for line in log.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            found.append((int(parts[0]), parts[1]))
    return found


#: The member of a CRI-O checkpoint archive holding the container's log (CRI format).
ARCHIVED_LOG = "io.kubernetes.cri-o.LogPath"


def archived_log(archive: Path) -> str:
    """The checkpointed container's output as the archive holds it (what CRI-O puts at
    the start of the restored container's log); empty when the archive has none."""
    with tarfile.open(archive) as tar:
        try:
            member = tar.extractfile(ARCHIVED_LOG)
        except KeyError:
            return ""
        raw = member.read().decode(errors="replace") if member else ""
    # CRI log lines: "<time> <stream> <P|F> <text>".
    return "\n".join(line.split(" ", 3)[3] for line in raw.splitlines()
                     if line.count(" ") >= 3)


def resumed_at(log: list[Tick], archived: list[Tick], token: str) -> int | None:
    """The count at which a restored counter went on, or ``None`` when ``log`` (the
    restored container's) does not read as the checkpointed process going on.

    The restored log starts with the archived one (``1..N+k``: the kubelet API leaves the
    source running, so it may print ``k`` more lines between CRIU's dump and the copy of
    its log); then the restored process prints ``N+1, N+2...``, consecutive, with the
    source's token (drawn once when it started: a restarted shell draws a new one)."""
    if not log or any(t != token for _count, t in log):
        return None
    if log[:len(archived)] != archived:
        return None
    went_on = [c for c, _t in log[len(archived):]]
    if not went_on or went_on != list(range(went_on[0], went_on[0] + len(went_on))):
        return None
    last = archived[-1][0] if archived else went_on[0] - 1
    return went_on[0] if 2 <= went_on[0] <= last + 1 else None


@dataclass
class RealNodeWorld:
    tmp: Path
    envtest: Envtest
    nodes: RealNodes
    kubeconfig: Path  # admin
    kube: KubeHttp
    names: tuple[str, ...] = NODES
    sysctls_before: dict[str, str] = field(default_factory=dict)  # before any world
    _closed: bool = False

    # --- what the world is ---------------------------------------------------------------

    @property
    def registry(self) -> str:
        """``127.0.0.1:<port>``, plain HTTP; the nodes treat it as insecure."""
        assert self.nodes.registry is not None
        return self.nodes.registry.host

    @property
    def image(self) -> str:
        """The busybox test image (``/bin/sh``, ``sleep``, ``echo``...)."""
        return self.nodes.busybox_image

    @property
    def pause_image(self) -> str:
        return self.nodes.pause_image

    def node(self, name: str) -> RealNode:
        return self.nodes.nodes[name]

    def kubelet_url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.node(name).settings.kubelet_port}"

    # --- pods ----------------------------------------------------------------------------

    def create_pod(self, name: str, node: str, *, image: str | None = None,
                   command: Sequence[str] | None = None, container: str = "main",
                   namespace: str = NAMESPACE, labels: Mapping[str, str] | None = None,
                   ) -> Obj:
        """A one-container pod bound to ``node`` (``spec.nodeName``); the created object.
        ``image`` defaults to the busybox test image; a checkpoint image's pod is restored
        by CRI-O, its ``command`` ignored."""
        spec: Obj = {"name": container, "image": image or self.image}
        if command is not None:
            spec["command"] = list(command)
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": dict(labels or {"app": name})},
                "spec": {"nodeName": node, "containers": [spec], "restartPolicy": "Never",
                         "terminationGracePeriodSeconds": 0}}
        created: Obj = self.kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
        return created

    def pod(self, name: str, namespace: str = NAMESPACE) -> Obj | None:
        return self.kube.pod(namespace, name)

    def wait_running(self, name: str, namespace: str = NAMESPACE, limit: float = 90) -> Obj:
        """The pod once the API server says ``Running`` with every container running; fails
        at once (with its status) when it cannot get there."""
        def running() -> Obj | None:
            pod = self.pod(name, namespace)
            status = (pod or {}).get("status", {})
            if status.get("phase") in ("Failed", "Succeeded"):
                raise AssertionError(f"pod {name} ended: {json.dumps(status)[:2000]}")
            statuses = status.get("containerStatuses") or []
            if status.get("phase") == "Running" and statuses and all(
                    "running" in s.get("state", {}) for s in statuses):
                return pod
            return None
        return wait_for(running, f"pod {namespace}/{name} Running", limit)

    def delete_pod(self, name: str, namespace: str = NAMESPACE) -> None:
        with contextlib.suppress(Exception):
            self.kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}",
                              {"gracePeriodSeconds": 0})

    # --- the kubelet API -----------------------------------------------------------------

    def kubelet(self, node: str, method: str, path: str, *, timeout: float = 60) -> bytes:
        """A call to ``node``'s kubelet API with the admin token (the kubelet asks the API
        server: TokenReview, then SubjectAccessReview, e.g. for ``nodes/checkpoint``),
        trusting the world's CA for the kubelet's serving certificate."""
        context = ssl.create_default_context(cafile=str(self.nodes.pki.ca_cert)
                                             if self.nodes.pki else None)
        request = urllib.request.Request(self.kubelet_url(node) + path, method=method,
                                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
                body: bytes = resp.read()
                return body
        except urllib.error.HTTPError as exc:
            with exc:
                raise AssertionError(f"kubelet {node} {method} {path}: {exc.code} "
                                     f"{exc.read().decode(errors='replace')[:2000]}") from None

    def container_log(self, pod: str, container: str = "main", *,
                      namespace: str = NAMESPACE, node: str | None = None) -> str:
        """The container's log as the kubelet serves it (``/containerLogs``)."""
        where = node or self._node_of(pod, namespace)
        return self.kubelet(where, "GET", f"/containerLogs/{namespace}/{pod}/{container}"
                            ).decode(errors="replace")

    def log_through_api_server(self, pod: str, container: str = "main", *,
                               namespace: str = NAMESPACE) -> str:
        """``kubectl logs``: the API server dials the pod's kubelet by the node's name."""
        k = self.kube
        request = urllib.request.Request(
            f"{k.server}/api/v1/namespaces/{namespace}/pods/{pod}/log?container={container}",
            headers={"Authorization": f"Bearer {k.token}"})
        with urllib.request.urlopen(request, timeout=30, context=k.context) as resp:
            return str(resp.read().decode(errors="replace"))

    def log_files(self, pod: str, *, namespace: str = NAMESPACE,
                  node: str | None = None) -> list[Path]:
        """The pod's log files under the node's ``podLogsDir`` (CRI format lines)."""
        found = self.pod(pod, namespace)
        assert found is not None, pod
        where = node or found["spec"]["nodeName"]
        folder = (self.node(where).settings.pod_logs
                  / f"{namespace}_{pod}_{found['metadata']['uid']}")
        return sorted(folder.rglob("*.log"))

    def checkpoint(self, pod: str, container: str = "main", *, namespace: str = NAMESPACE,
                   node: str | None = None) -> Path:
        """The kubelet checkpoint API (``POST /checkpoint/<ns>/<pod>/<container>``) on the
        pod's node; the archive's path on the host (the kubelet's ``checkpoints/``). The
        container keeps running."""
        where = node or self._node_of(pod, namespace)
        answer = json.loads(self.kubelet(where, "POST",
                                         f"/checkpoint/{namespace}/{pod}/{container}"))
        (archive,) = answer["items"]
        path = Path(archive)
        assert path.is_file(), f"the kubelet named {archive}, which is not there"
        return path

    def push_checkpoint_image(self, archive: Path, container: str = "main", *,
                              repository: str = "checkpoints/restore", tag: str) -> str:
        """The archive as a checkpoint image (``FROM scratch``, the archive at ``/``, the
        manifest annotation CRI-O restores from) in the world's registry; its reference."""
        return images.push_checkpoint_image(self.registry, archive, container=container,
                                            repository=repository, tag=tag)

    def pull(self, node: str, image: str) -> None:
        """Pre-pull ``image`` on ``node`` (a restore needs the checkpointed container's
        base image there: the archive holds only its root filesystem's changes)."""
        done = self.node(node).crictl("pull", image, timeout=120)
        assert done.returncode == 0, f"crictl pull {image} on {node}: {done.stderr}"

    def _node_of(self, pod: str, namespace: str) -> str:
        found = self.pod(pod, namespace)
        assert found is not None, f"no pod {namespace}/{pod}"
        return str(found["spec"]["nodeName"])

    # --- the end -------------------------------------------------------------------------

    def leftovers(self) -> list[str]:
        """What of this world is still on the host: bridges, cgroups, mounts, its folder."""
        found = []
        held = self.nodes.held
        slot_bridges = [node.settings.bridge for node in self.nodes.nodes.values()]
        slot_cgroups = [node.settings.cgroup_root for node in self.nodes.nodes.values()]
        if held is not None:
            slot_bridges += held.bridges
            slot_cgroups += held.cgroups
        for bridge in sorted(set(slot_bridges)):
            if Path("/sys/class/net", bridge).exists():
                found.append(f"bridge {bridge}")
        for root in sorted(set(slot_cgroups)):
            found += [f"cgroup {p}" for p in host.leftover_cgroups(root)]
        found += [f"mount {m}" for m in host.mounts_under(self.nodes.root)]
        if self.nodes.root.exists():
            found.append(f"folder {self.nodes.root}")
        return found

    def close(self) -> list[str]:
        """Stop the nodes (before the API server they talk to), then the API server;
        the problems the nodes' teardown met. Idempotent."""
        if self._closed:
            return []
        self._closed = True
        problems = self.nodes.stop()
        self.envtest.stop()
        return problems


def _skip_or_fail() -> tuple[Path, Path]:
    """The node binaries and the API server's assets, or skip/fail saying why."""
    binaries = binaries_folder()
    if binaries is None:
        pytest.skip(HOW_TO_ENABLE)
    assets = os.environ.get(ASSETS)
    if not assets:  # an existing cluster (CONTROLPLANE_TEST_KUBECONFIG) will not do
        pytest.fail(f"real nodes need a kube-apiserver of their own: {HOW_TO_ENABLE_ENVTEST}",
                    pytrace=False)
    find_real_cluster()  # raises, naming what is missing, if the folder lacks a binary
    return binaries, Path(assets)


@contextlib.contextmanager
def open_realnode_world(tmp: Path, names: Sequence[str] = NODES) -> Iterator[RealNodeWorld]:
    """Two (or ``names``) Ready real nodes and their API server; all stopped and given
    back on the way out, also when the body fails."""
    binaries, assets = _skip_or_fail()
    nodes = RealNodes(tmp / "nodes", tuple(names), binaries)
    kubelets = {n: Identity(f"system:node:{n}", f"kubelet-{n}-token",
                            ("system:nodes", "system:authenticated")) for n in names}
    world: RealNodeWorld | None = None
    try:
        nodes.prepare()
        # The host's values before any world changed them: recorded by the first world
        # to start, this one or another still running on the host.
        sysctls_before = host.SysctlRecord.recorded()
        with running_envtest(assets, tmp / "envtest", identities=list(kubelets.values()),
                             extra_args=nodes.apiserver_args,
                             hosts_file=nodes.hosts_file) as env:
            kubeconfig = env.write_kubeconfig(tmp / "admin.kubeconfig")
            world = RealNodeWorld(tmp, env, nodes, kubeconfig,
                                  KubeHttp.from_kubeconfig(kubeconfig), tuple(names),
                                  sysctls_before)
            nodes.start({n: env.write_kubeconfig(tmp / f"kubelet-{n}.kubeconfig", who)
                         for n, who in kubelets.items()})
            nodes.wait_ready()
            yield world
            world.close()
    finally:
        if world is not None:
            world.close()
        else:
            nodes.stop()


@pytest.fixture(scope="session")
def realnode_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNodeWorld]:
    """The session's real nodes, shared by the tests that import this fixture."""
    with open_realnode_world(tmp_path_factory.mktemp("realnode")) as world:
        yield world


__all__ = [
    "NAMESPACE",
    "NODES",
    "RealNodeWorld",
    "Tick",
    "archived_log",
    "counter_command",
    "open_realnode_world",
    "realnode_world",
    "resumed_at",
    "ticks",
]
