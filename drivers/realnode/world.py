"""N real nodes against one API server: the loopback registry, the images, the nodes.

:class:`RealNodes` is used in two halves around the API server, because the server's
flags name files made here first:

1. :meth:`RealNodes.prepare`: a host slot (:mod:`.host`), the certificates
   (:mod:`.pki`) and the hosts file; then the caller starts (or has) the API server with
   :attr:`RealNodes.apiserver_args` and, seen by it as ``/etc/hosts``,
   :attr:`RealNodes.hosts_file`;
2. :meth:`RealNodes.start` with a kubeconfig for the kubelets: the registry, the pause
   and busybox images, then every node (:mod:`.node`); :meth:`RealNodes.wait_ready`.

:meth:`RealNodes.stop` gives everything back, whatever state start reached: nodes, the
registry, the Node objects (while the API server is up), the folder, the slot and — when
this was the host's last world — the sysctls. It is idempotent and also runs at
interpreter exit. Used by ``tests/support/realnode.py`` and ``python -m drivers.realnode``
(``cpctl sim nodes --real``).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from drivers.loopback import free_port
from drivers.realnode import config, host, images, kubeapi
from drivers.realnode.config import NodeSettings
from drivers.realnode.node import NodeFailed, RealNode
from drivers.realnode.pki import Pki, make_pki
from drivers.realnode.registry import LoopbackRegistry, start_registry
from drivers.realnode.runc_wrapper import script

REALNODE = "CONTROLPLANE_REALNODE"
HOW_TO_ENABLE = (f"no real node binaries: run `eval \"$(scripts/ensure-realnode)\"` (sets "
                 f"{REALNODE}; needs ../shared/realnode beside the clone)")
CRIU = Path(os.environ.get("CONTROLPLANE_CRIU", "/usr/local/sbin/criu"))


def binaries_folder() -> Path | None:
    """``$CONTROLPLANE_REALNODE/bin`` when scripts/ensure-realnode made it, else None."""
    found = os.environ.get(REALNODE)
    return Path(found) / "bin" if found else None


def _exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def prepared_pki(folder: Path, names: Sequence[str], *, reuse: bool) -> Pki:
    """The certificates in ``folder``: those already there when ``reuse`` and they
    cover every node (the API server was started naming them), else new ones."""
    found = Pki(folder)
    if reuse and found.ca_cert.exists() and all(found.serving(n)[0].exists() for n in names):
        return found
    return make_pki(folder, names, now=datetime.datetime.now(datetime.UTC))


@dataclass
class RealNodes:
    root: Path  # every file of the world; removed by stop()
    names: Sequence[str]
    binaries: Path
    criu: Path = CRIU
    log_level: str = "info"
    pki_dir: Path | None = None  # certificates made beforehand (``pki``), kept at stop
    held: host.Holding | None = None
    pki: Pki | None = None
    registry: LoopbackRegistry | None = None
    pause_image: str = ""
    busybox_image: str = ""
    nodes: dict[str, RealNode] = field(default_factory=dict)
    api: kubeapi.Api | None = None
    _took_sigterm: bool = False

    @property
    def hosts_file(self) -> Path:
        return (self.pki_dir or self.root) / "hosts"

    @property
    def apiserver_args(self) -> list[str]:
        assert self.pki is not None, "prepare() first"
        cert, key = self.pki.apiserver_client
        return config.apiserver_args(client_cert=cert, client_key=key,
                                     kubelet_ca=self.pki.ca_cert)

    def prepare(self) -> RealNodes:
        self._check_tools()
        if len(self.names) > host.NODES_PER_WORLD:
            raise ValueError(f"at most {host.NODES_PER_WORLD} nodes in a world")
        self.root.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        self._exit_on_sigterm()
        self.held = host.taken_slot(self.root)
        self.held.cgroups = [host.cgroup_root(self.held.slot, n) for n in self.names]
        self.held.bridges = [host.bridge_name(self.held.slot, i) for i in range(len(self.names))]
        self.held.save()  # before any of them exists: a sweeper then knows to remove them
        self.pki = prepared_pki(self.pki_dir or self.root / "pki", self.names,
                                reuse=self.pki_dir is not None)
        self.hosts_file.write_text(config.hosts_file(self.names))
        return self

    def _exit_on_sigterm(self) -> None:
        """A SIGTERM to a process that has no handler for it (a test run stopped by CI)
        becomes ``SystemExit``, so ``finally`` blocks and :meth:`stop` run; a process
        with a handler of its own (the ``up`` command) keeps it. SIGKILL leaves it to
        ``--pdeathsig`` and the next world's sweep (:func:`host.taken_slot`)."""
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
            signal.signal(signal.SIGTERM, _exit)
            self._took_sigterm = True

    def _check_tools(self) -> None:
        missing = [str(self.binaries / b) for b in ("kubelet", "crio", "pinns", "crictl", "pause")
                   if not os.access(self.binaries / b, os.X_OK)]
        missing += [t for t in ("conmon", "runc", "unshare", "nsenter", "setpriv", "ip")
                    if shutil.which(t) is None]
        if not os.access(self.criu, os.X_OK):
            missing.append(f"CRIU 4.1 at {self.criu} (scripts/ensure-criu)")
        if missing:
            raise NodeFailed(f"real nodes need {', '.join(missing)}: run scripts/ensure-realnode")

    def start(self, kubeconfig: Path | Mapping[str, Path]) -> RealNodes:
        """The registry, the images and every node, started (not yet Ready). The kubelets'
        credentials: one kubeconfig for all, or one per node name."""
        if self.held is None or self.pki is None:
            raise RuntimeError("RealNodes.prepare() first")
        per_node = kubeconfig if isinstance(kubeconfig, Mapping) else \
            dict.fromkeys(self.names, kubeconfig)
        self.api = kubeapi.Api.from_kubeconfig(per_node[self.names[0]])
        self.registry = start_registry(self.root / "registry")
        registry_owner = host.Owner.of(self.registry.proc.pid)
        if registry_owner is not None:
            self.held.pids.append(registry_owner)
            self.held.save()
        self.pause_image = images.push_pause_image(self.registry.host, self.binaries / "pause")
        self.busybox_image = images.push_busybox_image(self.registry.host)
        wrapper = self.root / "runc-wrapper"
        wrapper.write_text(script(python=sys.executable, runc=str(shutil.which("runc"))))
        wrapper.chmod(0o755)
        held = self.held

        def record(owner: host.Owner) -> None:
            held.pids.append(owner)
            held.save()

        for index, name in enumerate(self.names):
            cert, key = self.pki.serving(name)
            settings = NodeSettings(
                name=name, folder=self.root / name, binaries=self.binaries,
                criu_dir=self.criu.parent, runtime_wrapper=wrapper,
                conmon=Path(shutil.which("conmon") or "/usr/bin/conmon"),
                cni_plugins=Path("/usr/lib/cni"), pause_image=self.pause_image,
                registry=self.registry.host, kubeconfig=per_node[name],
                kubelet_port=free_port(), cgroup_root=host.cgroup_root(held.slot, name),
                bridge=host.bridge_name(held.slot, index), subnet=host.subnet(held.slot, index),
                serving_cert=cert, serving_key=key, client_ca=self.pki.ca_cert,
                log_level=self.log_level)
            node = RealNode(settings, self.hosts_file, on_started=record)
            self.nodes[name] = node
            node.start()
        return self

    def wait_ready(self, limit: float = 90) -> None:
        """Until every node is Ready in the API server (polled: another process's state);
        a daemon that exits meanwhile fails at once with its log."""
        assert self.api is not None
        deadline = time.monotonic() + limit
        waiting = list(self.names)
        while waiting:
            for node in self.nodes.values():
                node.check_running()
            waiting = [n for n in waiting if not kubeapi.is_ready(self._node_or_none(n))]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise NodeFailed(f"nodes {', '.join(waiting)} not Ready within {limit:.0f} s; "
                                 f"kubelet log: {self._kubelet_tail(waiting[0])}")
            time.sleep(0.1)

    def _node_or_none(self, name: str) -> dict[str, object] | None:
        assert self.api is not None
        try:
            return self.api.node(name)
        except OSError:  # the API server is busy: ask again
            return None

    def _kubelet_tail(self, name: str) -> str:
        path = self.root / name / "kubelet.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> list[str]:
        """Give everything back; the problems met (each step is tried regardless)."""
        atexit.unregister(self.stop)
        if self._took_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._took_sigterm = False
        problems: list[str] = []
        # Side by side: most of a node's stop is waiting on crictl and CRI-O. (Threads
        # only stop: a daemon started from a thread would die with it, ``--pdeathsig``.)
        with ThreadPoolExecutor(max(1, len(self.nodes))) as pool:
            for found in pool.map(RealNode.stop, self.nodes.values()):
                problems += found
        if self.api is not None:
            for name in self.nodes:
                with contextlib.suppress(Exception):
                    self.api.delete_node(name)
        self.nodes.clear()
        if self.registry is not None:
            self.registry.stop()
            self.registry = None
        if self.held is not None:
            held, self.held = self.held, None
            for bridge in held.bridges:  # also those of nodes that never started
                host.delete_link(bridge)
            for root in held.cgroups:
                with contextlib.suppress(OSError):
                    host.remove_cgroup_root(root)
            host.remove_folder(self.root)
            host.released_slot(held)
        return problems
