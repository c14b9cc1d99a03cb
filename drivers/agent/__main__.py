"""``python -m drivers.agent --node NAME ...``: run one node agent as a process.

In a cluster it runs as a DaemonSet pod (``--node`` from the downward API's
``spec.nodeName``, in-cluster config, the node's checkpoint directory mounted); next to
the simulator it runs once per simulated node. It connects to the API server
(kubeconfig or in-cluster), watches the pods of its node, serves capture and restore
requests with the chosen dumper, pushes to the chosen registry (an OCI layout directory,
or registries over HTTP), prints one line when it serves, and runs until SIGTERM/SIGINT.
Its ``--workdir`` is its own (:func:`claim_workdir`): by default one per node under the
working directory, created, checked writable and locked before anything else starts.
With ``--handoff-key`` it also streams checkpoints straight to other nodes' agents
(:func:`handoff_from`; docs/protocol.md, "Handoff"); a key it cannot use stops it at start.
With ``--metrics-listen`` it serves its own ``/metrics`` (:mod:`drivers.agent.metrics`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from drivers.agent.agent import AgentSettings
from drivers.agent.criu import CriuDumper
from drivers.agent.handoffs import HandoffKeyUnusable, HandoffSettings, read_handoff_key
from drivers.agent.kubelet import KubeletDumper, KubeletSettings, token_from_file
from drivers.agent.metrics import metrics_endpoint
from drivers.agent.pods import PodPatcher
from drivers.agent.runner import DumperFactory, node_agent
from drivers.agent.sealing import Sealing, SealingSettings
from drivers.agent.sim import SimDumper
from drivers.kube import KubeDriver, KubeSettings
from drivers.podman.lazy_runc import runtime_under
from drivers.podman.podman import PodmanNode
from drivers.registry.options import registry_from_options
from drivers.registry.port import Registry

#: The default ``--workdir`` is ``DEFAULT_WORKDIRS/NODE`` under the working directory (as
#: cpctl's default database is ``var/controlplane.db``): one per node, so the agents of
#: several nodes on one host never share one. A DaemonSet passes its mounted path instead.
DEFAULT_WORKDIRS = "var/checkpoint-agent"
WORKDIR_ENV = "CONTROLPLANE_AGENT_WORKDIR"
#: Every interface, one fixed port: the target agent connects over the pod network to the
#: address the source advertises, and a NetworkPolicy or a node firewall can only let a
#: known port through (port 0 would be a new one at every start). Listening widely exposes
#: nothing to a peer without the shared key: requests are authenticated, streams sealed.
DEFAULT_HANDOFF_LISTEN = "0.0.0.0:9447"


class WorkdirUnusable(Exception):
    """The ``--workdir`` cannot be created, written or had for this agent alone: one line
    that names the flag, the path and the fix (exit 2)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m drivers.agent",
                                description="The checkpoint node agent of one node.")
    p.add_argument("--node", default=os.environ.get("NODE_NAME", ""),
                   help="the node this agent serves (default: $NODE_NAME)")
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, $KUBECONFIG)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--namespace", help="serve only pods of this namespace (default: all)")
    p.add_argument("--workdir", default=os.environ.get(WORKDIR_ENV, ""), metavar="DIR",
                   help="node-local scratch space for archives, this agent's alone "
                        f"(default: ${WORKDIR_ENV}, else {DEFAULT_WORKDIRS}/NODE under the "
                        "working directory; created if missing)")
    p.add_argument("--layout", help="push to / pull from OCI layouts under this directory "
                                    "(the embedded default) instead of registries over HTTP")
    p.add_argument("--plain-http", action="append", default=[], metavar="HOST",
                   help="speak plain HTTP to this registry host (loopback always is)")
    p.add_argument("--credentials", nargs=3, action="append", default=[],
                   metavar=("HOST", "USER", "PASSWORD_FILE"),
                   help="basic credentials for a registry host (also for its token endpoint)")
    p.add_argument("--dumper", choices=("sim", "kubelet", "criu"), default="kubelet",
                   help="sim: the simulator's marker; kubelet: the kubelet's checkpoint "
                        "API; criu: CRIU through the node's podman (--runtime-root)")
    p.add_argument("--runtime-root", default="",
                   help="with --dumper criu: the podman storage roots of the emulated "
                        "nodes (`cpctl sim nodes --runtime-root`); this node's is DIR/<node>")
    p.add_argument("--plain-runc", dest="lazy_runtime", action="store_false",
                   help="with --runtime-root: the nodes' podman runs plain runc, not the "
                        "lazy-pages wrapper DIR/lazy-runc (as `cpctl sim nodes "
                        "--plain-runc`); lazy migrations are then refused")
    p.add_argument("--kubelet-url", default="https://127.0.0.1:10250")
    p.add_argument("--kubelet-token-file",
                   default="/var/run/secrets/kubernetes.io/serviceaccount/token")
    p.add_argument("--kubelet-ca", default="", help="CA bundle of the kubelet's certificate")
    p.add_argument("--kubelet-client-cert", default="",
                   help="client certificate for the kubelet (instead of, or with, the token)")
    p.add_argument("--kubelet-client-key", default="", help="key of --kubelet-client-cert")
    p.add_argument("--kubelet-insecure", action="store_true",
                   help="do not verify the kubelet's serving certificate")
    p.add_argument("--checkpoint-dir", default="/var/lib/kubelet/checkpoints",
                   help="the node's kubelet checkpoint directory, as mounted in the agent")
    p.add_argument("--kubelet-checkpoint-dir", default="/var/lib/kubelet/checkpoints",
                   help="the same directory as the kubelet names it in its answers (its "
                        "--root-dir + /checkpoints)")
    p.add_argument("--cgroup-root", default="/sys/fs/cgroup",
                   help="the node's cgroup file system, as mounted in the agent: a quiesced "
                        "capture stops the container's processes found there")
    p.add_argument("--cri-endpoint", default="",
                   help="the runtime's CRI socket (unix:///var/run/crio/crio.sock): before a "
                        "CRI-O restore, the agent pulls each container's base image with "
                        "crictl (CRI-O restores onto it and does not pull it)")
    p.add_argument("--crictl", default="crictl", help="the crictl binary for --cri-endpoint")
    p.add_argument("--crio-root", default="", metavar="DIR",
                   help="CRI-O's storage root as mounted (its `root`): with --runc-root and "
                        "--cri-endpoint, the kubelet dumper migrates lazily")
    p.add_argument("--runc-root", default="", metavar="DIR",
                   help="CRI-O's runc root as mounted (its runtime_root), where the lazy "
                        "runc wrapper finds the target's lazy-pages daemon")
    p.add_argument("--criu", default="criu", help="CRIU for the target's lazy-pages daemon")
    p.add_argument("--capture-timeout", type=float, default=600.0)
    p.add_argument("--restore-timeout", type=float, default=600.0)
    keys = p.add_argument_group("sealed checkpoints (docs/security.md)")
    keys.add_argument("--signing-key", default=os.environ.get("CONTROLPLANE_SIGNING_KEY"),
                      metavar="PEM", help="EC P-256 private key: every checkpoint manifest "
                      "this agent pushes is signed with it before its tag names it")
    keys.add_argument("--trusted-key", action="append", default=[], metavar="PEM",
                      help="public key whose signatures a restore accepts (repeatable; give "
                      "the old and the new key while rotating). With none, restores verify "
                      "nothing: a cluster install always gives one")
    keys.add_argument("--secrets-dir", default="", metavar="DIR",
                      help="where Secrets are mounted: a class's secret:NAME/KEY (a "
                      "recipient, or the key that unseals) is the file DIR/NAME/KEY")
    keys.add_argument("--decryption-key", action="append", default=[], metavar="PEM",
                      help="this node's own private key(s) for sealed checkpoints, tried after "
                      "the one the class names (repeatable)")
    handoff = p.add_argument_group("checkpoint handoff to other nodes' agents "
                                   "(docs/protocol.md)")
    handoff.add_argument("--handoff-key", default="", metavar="FILE",
                         help="the agents' shared key (at least 32 bytes, the same file on "
                         "every node): serve and fetch handoffs. Without it the agent refuses "
                         "captures and restores that ask for one")
    handoff.add_argument("--handoff-listen", default=DEFAULT_HANDOFF_LISTEN,
                         metavar="HOST:PORT", help="where the handoff server listens "
                         f"(default {DEFAULT_HANDOFF_LISTEN}: every interface, a port a "
                         "NetworkPolicy can name; 127.0.0.1:0 for tests)")
    handoff.add_argument("--handoff-advertise", default=os.environ.get("POD_IP", ""),
                         metavar="HOST", help="the host other agents reach this one at, "
                         "written into report-handoff (default: $POD_IP, from the downward "
                         "API, else the --handoff-listen host)")
    p.add_argument("--metrics-listen", default="", metavar="HOST:PORT",
                   help="serve this agent's own Prometheus /metrics here (captures, "
                        "restores and failures by node; docs/alerts.md); off by default")
    args = p.parse_args(argv)
    try:
        args.handoff_host, args.handoff_port = parse_listen(args.handoff_listen)
    except ValueError as exc:
        p.error(f"--handoff-listen {args.handoff_listen!r}: {exc}")
    args.metrics = None
    if args.metrics_listen:
        try:
            args.metrics = parse_listen(args.metrics_listen)
        except ValueError as exc:
            p.error(f"--metrics-listen {args.metrics_listen!r}: {exc}")
    if args.handoff_key and not args.handoff_advertise and \
            args.handoff_host in ("0.0.0.0", "::", ""):
        p.error(f"--handoff-advertise: the handoff server listens on every interface "
                f"({args.handoff_listen}) and $POD_IP is unset: give --handoff-advertise "
                "HOST, the address other nodes' agents reach this one at")
    if not args.node:
        p.error("--node (or $NODE_NAME) is required")
    if args.dumper == "criu" and not args.runtime_root:
        p.error("--dumper criu needs --runtime-root DIR (the nodes' podman roots, as given "
                "to `cpctl sim nodes --runtime-root`)")
    args.workdir = args.workdir or str(Path(DEFAULT_WORKDIRS) / args.node)
    return args


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) as a host and a port; ``ValueError`` saying why not."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError("not HOST:PORT (e.g. 0.0.0.0:9447, [::]:9447, 127.0.0.1:0)")
    return host.removeprefix("[").removesuffix("]"), int(port)


def handoff_from(args: argparse.Namespace) -> HandoffSettings | None:
    """The handoff from the flags (``None``: no ``--handoff-key``); a key file that cannot
    be used raises :class:`HandoffKeyUnusable` (the agent does not start)."""
    if not args.handoff_key:
        return None
    return HandoffSettings(read_handoff_key(Path(args.handoff_key)), args.handoff_host,
                           args.handoff_port, advertise=args.handoff_advertise)


def claim_workdir(path: Path) -> tuple[Path, IO[str]]:
    """``path`` (absolute) created, proven writable and locked for this process, with the
    open lock file that holds the lock until the process ends; else
    :class:`WorkdirUnusable`. The lock makes a second agent given the same directory
    refuse to start instead of mixing its archives with the first one's."""
    workdir = path.resolve()
    default = f"the default is {DEFAULT_WORKDIRS}/NODE under the working directory"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(dir=workdir).cleanup()  # jobs make subdirectories
        lock = (workdir / "agent.lock").open("a+")
    except OSError as exc:
        why = ("a file is in the way" if isinstance(exc, FileExistsError | NotADirectoryError)
               else exc.strerror or type(exc).__name__)
        raise WorkdirUnusable(f"--workdir {workdir}: cannot create or write it: {why}; "
                              f"pass --workdir a directory this agent can write ({default})"
                              ) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise WorkdirUnusable(f"--workdir {workdir}: another agent (pid {holder}) uses it; "
                              f"give each agent its own --workdir ({default})") from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return workdir, lock


def registry_from(args: argparse.Namespace) -> Registry:
    return registry_from_options(layout=args.layout, plain_http=args.plain_http,
                                 credentials=args.credentials)


def dumper_from(args: argparse.Namespace) -> DumperFactory:
    if args.dumper == "sim":
        return SimDumper
    if args.dumper == "criu":
        root = Path(args.runtime_root).resolve()
        runtime = PodmanNode(root / args.node,
                             runtime=runtime_under(root, lazy=args.lazy_runtime))

        def build_criu(patcher: PodPatcher) -> CriuDumper:
            return CriuDumper(runtime)

        return build_criu
    token_file = Path(args.kubelet_token_file)
    settings = KubeletSettings(url=args.kubelet_url,
                               token=token_from_file(token_file) if token_file.exists() else "",
                               ca_file=args.kubelet_ca, insecure=args.kubelet_insecure,
                               client_cert=args.kubelet_client_cert,
                               client_key=args.kubelet_client_key,
                               checkpoint_dir=Path(args.checkpoint_dir),
                               kubelet_checkpoint_dir=args.kubelet_checkpoint_dir,
                               cgroup_root=Path(args.cgroup_root),
                               cri_endpoint=args.cri_endpoint, crictl=args.crictl,
                               crio_root=Path(args.crio_root) if args.crio_root else None,
                               runc_root=Path(args.runc_root) if args.runc_root else None,
                               criu=args.criu)

    def build(patcher: PodPatcher) -> KubeletDumper:
        return KubeletDumper(settings, patcher=patcher)

    return build


def sealing_from(args: argparse.Namespace) -> Sealing:
    """The node's keys from the flags; a key file that cannot be read stops the agent."""
    return Sealing.load(SealingSettings(
        signing_key=Path(args.signing_key) if args.signing_key else None,
        trusted_keys=tuple(Path(k) for k in args.trusted_key),
        secrets_dir=Path(args.secrets_dir) if args.secrets_dir else None,
        decryption_keys=tuple(Path(k) for k in args.decryption_key)))


async def serve(args: argparse.Namespace, handoff: HandoffSettings | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    kube_settings = KubeSettings(namespace=args.namespace)
    kube = await KubeDriver.connect(kubeconfig=args.kubeconfig, context=args.context,
                                    settings=kube_settings)
    registry = registry_from(args)
    settings = AgentSettings(args.node, Path(args.workdir),
                             capture_timeout=args.capture_timeout,
                             restore_timeout=args.restore_timeout)
    try:
        async with node_agent(client=kube.client, settings=settings, registry=registry,
                              dumper=dumper_from(args), kube=kube_settings,
                              sealing=sealing_from(args), handoff=handoff) as agent, \
                contextlib.AsyncExitStack() as endpoints:
            offers = f"; handoff offered at {agent.handoff.address}" if agent.handoff else ""
            if args.metrics is not None:
                bound = await endpoints.enter_async_context(
                    metrics_endpoint(args.node, agent.stats, *args.metrics))
                offers += f"; metrics http://{bound}/metrics"
            print(f"node agent serving {args.node} with the {args.dumper} dumper; workdir "
                  f"{args.workdir}{offers}", flush=True)
            await stop.wait()
    finally:
        await registry.close()
        await kube.close()
    print("node agent stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        handoff = handoff_from(args)
    except HandoffKeyUnusable as exc:
        sys.stderr.write(f"python -m drivers.agent: error: {exc}\n")
        return 2
    try:
        args.workdir, lock = claim_workdir(Path(args.workdir))
    except WorkdirUnusable as exc:
        sys.stderr.write(f"python -m drivers.agent: error: {exc}\n")
        return 2
    with lock:
        asyncio.run(serve(args, handoff))
    return 0


if __name__ == "__main__":
    sys.exit(main())
