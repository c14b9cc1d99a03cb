"""``cpctl sim up`` (the simulated API server) and ``cpctl sim nodes`` (the kubelet role).

Their flags are defined here once (``python -m drivers.sim up`` is ``cpctl sim up``); the
values are checked and the servers built by the composition root (``wiring.sim``),
imported only when these verbs run, so the other verbs never load the simulator or the
role. Called by :mod:`controlplane.cli.main`.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

NODES_HELP = """\
Run the kubelet role against the API server a kubeconfig names (like kwok): register the
nodes Ready (capacity = allocatable: --node-cpu, --node-memory, --node-pods; label
kubernetes.io/hostname; the server's node.kubernetes.io/not-ready taint removed) and keep
them Ready with a heartbeat; schedule pending pods onto any Ready node (nodeSelector,
required node affinity, taints/tolerations, cordon, capacity) through pods/binding, or mark
them PodScheduled=False Unschedulable; turn pods bound to these nodes Running after
--start-seconds; finish deleted pods after min(--stop-seconds, grace period). Driven by
watches; survives broken watches and API server restarts.

Prints one line on stdout once every node is registered, Ready and untainted:
  kubelets ready: node-1,node-2 on https://127.0.0.1:6443
then runs until SIGTERM or SIGINT (exit 0). No containers run: it is a stand-in for
kubelets and a scheduler, for tests and demos.

With --real, the nodes are real instead: a kubelet v1.36 and a CRI-O 1.36 per node (CRIU
4.1, runc), each in a mount namespace of its own with its own state folder, cgroup root,
CNI bridge and loopback ports, pulling from a loopback registry it starts (pause and
busybox images pushed there), until SIGTERM or SIGINT; then every pod, process, mount,
cgroup, bridge and host sysctl the kubelets changed is given back. Needs root,
eval "$(scripts/ensure-realnode)" (../shared/realnode) and scripts/ensure-criu. The
API server must be a real one (TokenReview, SubjectAccessReview: e.g. envtest's); the
kubelets use the kubeconfig's credentials. Pods are placed by spec.nodeName or a real
kube-scheduler (--real schedules nothing). The kubelet checkpoint API works at once;
for `kubectl logs`/`exec` the API server needs the flags `python -m drivers.realnode
pki --dir P` prints (start it with them, then pass --pki-dir P). Prints:
  real nodes ready: node-a,node-b on https://127.0.0.1:PORT; registry ...; state DIR
(then a line per node: its kubelet URL, CRI-O socket and logs). docs/realnode.md."""

NODES_EPILOG = """\
examples:
  cpctl sim nodes --kubeconfig admin.kubeconfig --nodes node-1,node-2,node-3
  cpctl sim nodes --kubeconfig var/sim-kubeconfig.yaml --nodes big-1 --node-cpu 64 \\
      --node-memory 256Gi --start-seconds 2 --stop-seconds 1
  cpctl sim nodes --real --kubeconfig envtest-admin.kubeconfig --nodes node-a,node-b
Against the simulator, start it with its own kubelets off (cpctl sim up --no-kubelets, or
SimCluster(kubelets=False)); both would otherwise schedule the same pods.
See docs/simulator.md.
exit: 0 after SIGTERM/SIGINT, 1 when the nodes cannot be registered in time, 2 on bad input.
"""


UP_HELP = """\
Serve a simulated Kubernetes cluster on 127.0.0.1 (the core/v1 and apps/v1 subset the
control plane uses, over real HTTP), with a scheduler, a kubelet per node and the workload
controllers in process, and write a kubeconfig for it. Nodes node-1..node-N start Ready
with the given capacity (= allocatable); a pod bound to one turns Running after
--start-seconds, a deleted one goes after min(--stop-seconds, its grace period).

Prints one line on stdout once it serves:
  simulated cluster listening on http://127.0.0.1:PORT (3 nodes, each cpu 4, memory 8Gi,
  pods 110); kubeconfig: var/sim-kubeconfig.yaml
(with the pod delays, the standing faults and their seed when given), then runs until
SIGTERM or SIGINT and prints "simulated cluster stopped". Loopback only; it accepts any
credentials. `python -m drivers.sim up` is the same command, for scripts."""

UP_EPILOG = """\
fault specs (--fault, repeatable): KIND,key=value,... ; several verbs join with +
  error,rate=R[,verb=V][,code=500][,resource=][,namespace=][,retry_after=S]
  latency,seconds=S[,verb=V][,jitter=S][,resource=]
  drop-watches,rate=R[,abrupt=true]
  conflicts,times=N|seconds=S[,resource=pods][,namespace=][,name=]
  forbid,verb=V,resource=R[,namespace=]
  verbs: get list watch create update patch delete deletecollection * ; rates 0..1

examples:
  cpctl sim up --nodes 3 --kubeconfig var/sim-kubeconfig.yaml
  cpctl sim up --nodes 2 --node-cpu 16 --node-memory 64Gi --node-pods 30 \\
      --start-seconds 2 --stop-seconds 1
  cpctl sim up --seed 7 --fault error,verb=patch+delete,rate=0.1,code=503 \\
      --fault latency,seconds=0.05,jitter=0.02 --fault forbid,verb=delete,resource=pods
  cpctl sim up --no-kubelets   # then: cpctl sim nodes --kubeconfig ... --nodes node-1,...
  cpctl sim up --crds deploy/base/crds   # the custom resources too (docs/resources.md)
  cpctl sim up --nodes 2 --kubeconfig var/kube.yaml --crds deploy/base/crds --workers
      # and agents and a worker on it: kubectl apply a Migration and watch it succeed
See docs/simulator.md.
exit: 0 after SIGTERM/SIGINT, 2 on bad input (the flag named).
"""


def add_up_parser(verbs: argparse._SubParsersAction[Any]) -> None:
    """``cpctl sim up``: its flags and help (``python -m drivers.sim up`` parses with this
    too, so the simulator's flags are defined here once)."""
    up = verbs.add_parser("up", help="serve a simulated cluster on 127.0.0.1 until SIGTERM "
                          "and write a kubeconfig for it", description=UP_HELP,
                          epilog=UP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    up.add_argument("--nodes", type=int, default=3, metavar="N",
                    help="how many Ready nodes, node-1..node-N (default 3)")
    up.add_argument("--kubeconfig", default="var/sim-kubeconfig.yaml", metavar="PATH",
                    help="where to write a kubeconfig for the cluster "
                         "(default var/sim-kubeconfig.yaml)")
    up.add_argument("--port", type=int, default=0,
                    help="port on 127.0.0.1 (default 0: any free one)")
    _node_options(up)
    up.add_argument("--fault", action="append", default=[], metavar="SPEC",
                    help="a standing fault, KIND,key=value,... (see below), e.g. "
                         "error,verb=patch,rate=0.1,code=503; repeatable (default: none)")
    up.add_argument("--seed", type=int, default=0, metavar="N",
                    help="seed of the faults' random sequence: the same seed and the same "
                         "requests in the same order fail the same way (default 0)")
    up.add_argument("--crds", default=None, metavar="DIR",
                    help="serve the CustomResourceDefinitions in DIR's *.yaml files (other "
                         "kinds there are skipped), e.g. deploy/base/crds: the product's "
                         "custom resources, for kubectl apply/get/describe and the workers' "
                         "front door; installed before the ready line (default: none; "
                         "kubectl apply -f of a CRD works too)")
    up.add_argument("--workers", action="store_true",
                    help="also run the control plane on it, each as its own process: the "
                         "schema upgraded (cpctl db upgrade on --db), a node agent per node "
                         "(sim dumper) and a cpctl worker, over the OCI layout "
                         "--registry-layout; their logs in a folder beside the kubeconfig. "
                         "With --crds: a whole local world where the custom resources act, "
                         "in one command (docs/resources.md, \"Try it locally\")")
    up.add_argument("--registry-layout", default="var/oci", metavar="DIR",
                    help="with --workers: the OCI image layout the agents push to and the "
                         "worker reads (default var/oci)")
    up.add_argument("--no-kubelets", dest="kubelets", action="store_false",
                    help="no in-process scheduler, kubelets or nodes: run `cpctl sim nodes` "
                    "against it instead (default: they run)")
    up.set_defaults(handler=sim_cmd)


async def sim_cmd(args: argparse.Namespace) -> int:
    import asyncio

    from controlplane.errors import UsageError
    from controlplane.wiring.sim import run_simulator

    if args.workers and (not args.kubelets or not args.kubeconfig):
        raise UsageError("--workers needs the simulator's nodes and a kubeconfig",
                         hint="drop --no-kubelets; keep --kubeconfig (default "
                              "var/sim-kubeconfig.yaml)")
    crds = read_crds(args.crds) if args.crds else []
    signalled = _stop_on_signals()
    stop = asyncio.Event()  # the simulator's: set once the processes on it have stopped
    starting: list[asyncio.Task[None]] = []
    world = World()
    failed: list[str] = []

    async def start(url: str, kubeconfig: Path | None) -> None:
        try:
            await asyncio.to_thread(install_crds, url, crds)
            if args.workers and kubeconfig is not None:
                await world.start(args, kubeconfig)
        except (OSError, RuntimeError) as exc:
            failed.append(str(exc))
            signalled.set()
            return
        sys.stdout.write(up_line(args, url, kubeconfig) + "\n")
        sys.stdout.flush()

    async def stop_world_first() -> None:
        await signalled.wait()
        for task in starting:
            await task
        await world.stop()
        stop.set()

    def ready(url: str, kubeconfig: Path | None) -> None:
        starting.append(asyncio.get_running_loop().create_task(start(url, kubeconfig)))

    stopper = asyncio.get_running_loop().create_task(stop_world_first())
    try:
        await run_simulator(nodes=args.nodes, port=args.port, kubeconfig=args.kubeconfig,
                            kubelets=args.kubelets, node_cpu=args.node_cpu,
                            node_memory=args.node_memory, node_pods=args.node_pods,
                            start_seconds=args.start_seconds, stop_seconds=args.stop_seconds,
                            faults=args.fault, seed=args.seed, on_ready=ready, stop=stop)
    finally:
        stopper.cancel()
        await world.stop()
    if failed:
        sys.stderr.write(f"cpctl sim up: {failed[0]}\n")
        return 1
    sys.stdout.write("simulated cluster stopped\n")
    return 0


class World:
    """``--workers``: the control plane's processes on the simulator (the schema upgrade,
    an agent per node, a worker), each started and waited for in turn by its ready line,
    and stopped (SIGTERM, then SIGKILL after 20 s) before the simulator stops."""

    def __init__(self) -> None:
        self.procs: list[asyncio.subprocess.Process] = []
        self.pumps: list[asyncio.Task[None]] = []
        self.logs = Path()

    async def start(self, args: argparse.Namespace, kubeconfig: Path) -> None:
        self.logs = kubeconfig.parent / "sim-world"
        self.logs.mkdir(parents=True, exist_ok=True)
        cpctl = [sys.executable, "-m", "controlplane.cli.main", "--db", args.db]
        await self._run("db-upgrade", [*cpctl, "db", "upgrade"], ready=None)
        for i in range(1, args.nodes + 1):
            await self._run(f"agent-node-{i}", [
                sys.executable, "-m", "drivers.agent", "--node", f"node-{i}", "--kubeconfig",
                str(kubeconfig), "--layout", args.registry_layout, "--dumper", "sim"],
                ready="node agent serving")
        await self._run("worker", [*cpctl, "worker", "--kubeconfig", str(kubeconfig),
                                   "--registry-layout", args.registry_layout], ready="worker ")

    async def _run(self, name: str, argv: list[str], *, ready: str | None) -> None:
        """Start ``argv`` (its output to ``<logs>/<name>.log``) and wait for its line
        starting with ``ready`` (``None``: for it to exit 0)."""
        import asyncio

        log = (self.logs / f"{name}.log").open("ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=log,
                stdin=asyncio.subprocess.DEVNULL)
        finally:
            log.close()
        assert proc.stdout is not None
        if ready is None:
            out, _ = await proc.communicate()
            with (self.logs / f"{name}.log").open("ab") as written:
                written.write(out)
            if proc.returncode != 0:
                raise RuntimeError(f"--workers: {name} exited {proc.returncode}; see "
                                   f"{self.logs / name}.log")
            return
        self.procs.append(proc)
        async with asyncio.timeout(120):
            while True:
                line = await proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"--workers: {name} exited before it was ready; see "
                                       f"{self.logs / name}.log")
                if line.decode(errors="replace").startswith(ready):
                    break
        self.pumps.append(asyncio.get_running_loop().create_task(
            _pump(proc.stdout, self.logs / f"{name}.log")))

    async def stop(self) -> None:
        import asyncio
        import contextlib

        procs, self.procs = self.procs, []
        for proc in reversed(procs):  # the worker first, then the agents
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for proc in procs:
            try:
                async with asyncio.timeout(20):
                    await proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        pumps, self.pumps = self.pumps, []
        for pump in pumps:
            await pump


async def _pump(stream: asyncio.StreamReader, log: Path) -> None:
    """The rest of a process's stdout to its log, so that it never blocks on a full pipe."""
    with log.open("ab") as out:
        while line := await stream.readline():
            out.write(line)
            out.flush()


def read_crds(folder: str) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions of ``folder``'s ``*.yaml`` files (other kinds, such
    as the roles beside them in deploy/base/crds, skipped); a usage error if there are
    none or a file cannot be read."""
    import yaml

    from controlplane.errors import UsageError

    found: list[dict[str, Any]] = []
    try:
        for path in sorted(Path(folder).glob("*.yaml")):
            found += [doc for doc in yaml.safe_load_all(path.read_text())
                      if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition"]
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"--crds {folder}: cannot read it ({exc})",
                         hint="e.g. --crds deploy/base/crds") from None
    if not found:
        raise UsageError(f"--crds {folder}: no CustomResourceDefinition in its *.yaml files",
                         hint="e.g. --crds deploy/base/crds")
    return found


def install_crds(url: str, crds: list[dict[str, Any]]) -> None:
    """Create the CRDs through the simulator's own API, as ``kubectl create`` would (a
    thread's blocking HTTP: the server answers on the event loop meanwhile)."""
    import json
    import urllib.request

    for crd in crds:
        request = urllib.request.Request(
            f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            data=json.dumps(crd).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10):
            pass


def up_line(args: argparse.Namespace, url: str, kubeconfig: Path | None) -> str:
    """The ready line of ``cpctl sim up``: where it listens, then what it simulates.
    Scripts read the URL as the word after ``listening on``."""
    parts = [f"{args.nodes} nodes, each cpu {args.node_cpu}, memory {args.node_memory}, "
             f"pods {args.node_pods}" if args.kubelets else "no nodes, no kubelets"]
    if getattr(args, "crds", None):
        parts.append(f"the CRDs of {args.crds}")
    if getattr(args, "workers", False) and kubeconfig is not None:
        parts.append(f"{args.nodes} node agent(s) and a worker on {args.db}, registry layout "
                     f"{args.registry_layout}, logs in {kubeconfig.parent / 'sim-world'}")
    if args.kubelets and (args.start_seconds or args.stop_seconds):
        parts.append(f"pods start after {args.start_seconds:g}s, "
                     f"stop after {args.stop_seconds:g}s")
    if args.fault:
        parts.append(f"{len(args.fault)} standing fault(s), seed {args.seed}: "
                     + " ".join(args.fault))
    elif args.seed:
        parts.append(f"seed {args.seed}")
    line = f"simulated cluster listening on {url} ({'; '.join(parts)})"
    return f"{line}; kubeconfig: {kubeconfig}" if kubeconfig else line


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT: the servers stop cleanly and exit 0."""
    import asyncio  # here, not above: the parser imports this module, --help needs no loop

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def add_nodes_parser(verbs: argparse._SubParsersAction[Any]) -> None:
    """``cpctl sim nodes``: its flags and help."""
    p = verbs.add_parser("nodes", help="run the kubelet role (nodes, scheduler, kubelets) "
                         "against any API server until SIGTERM", description=NODES_HELP,
                         epilog=NODES_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", default=None, metavar="PATH",
                   help="the cluster to serve (default: $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", default=None, help="kubeconfig context (default: current)")
    p.add_argument("--nodes", required=True, metavar="NAMES",
                   help="comma-separated node names to register, e.g. node-1,node-2,node-3")
    _node_options(p)
    p.add_argument("--ready-timeout", type=float, default=60.0, metavar="S",
                   help="give up (exit 1) if the nodes are not Ready within this (default 60)")
    p.add_argument("--no-scheduler", dest="schedule", action="store_false",
                   help="bind nothing: a real kube-scheduler places the pods, the role only "
                        "runs the nodes' kubelets")
    p.add_argument("--runtime-root", default=None, metavar="DIR",
                   help="run pods as real containers: each node is a podman storage root "
                        "DIR/<node> (runc + CRIU; scripts/ensure-criu installs them). "
                        "Default: no containers, status only")
    p.add_argument("--plain-runc", dest="lazy_runtime", action="store_false",
                   help="with --runtime-root: create containers with plain runc instead of "
                        "the lazy-pages wrapper DIR/lazy-runc (they then cannot migrate "
                        "lazily; saves a Python start per runc call). Give the node agents "
                        "the same flag")
    p.add_argument("--real", action="store_true",
                   help="real nodes: a kubelet + CRI-O per node on this host (root; "
                        "scripts/ensure-realnode); the node shape and pod-delay flags and "
                        "--runtime-root do not apply (see above)")
    p.add_argument("--state-dir", default=None, metavar="DIR",
                   help="with --real: the nodes' state folder, removed when they stop "
                        "(default: a new folder under $TMPDIR)")
    p.add_argument("--pki-dir", default=None, metavar="DIR",
                   help="with --real: certificates made beforehand by `python -m "
                        "drivers.realnode pki --dir DIR`, which the API server's "
                        "--kubelet-* flags name (default: new ones in the state folder)")
    p.add_argument("--log-level", default="info", metavar="LEVEL",
                   help="with --real: CRI-O's log level (default info)")
    p.set_defaults(handler=nodes_cmd)


def _node_options(p: argparse.ArgumentParser) -> None:
    """The node shape and pod delays, the same for the simulator's nodes and the role's."""
    p.add_argument("--node-cpu", default="4", metavar="QTY",
                   help="CPU capacity (= allocatable) of each node (default 4)")
    p.add_argument("--node-memory", default="8Gi", metavar="QTY",
                   help="memory capacity (= allocatable) of each node (default 8Gi)")
    p.add_argument("--node-pods", type=int, default=110, metavar="N",
                   help="pods each node takes (default 110, a kubelet's default)")
    p.add_argument("--start-seconds", type=float, default=0.0, metavar="S",
                   help="how long a pod bound to a node takes to turn Running (default 0)")
    p.add_argument("--stop-seconds", type=float, default=0.0, metavar="S",
                   help="how long a deleted pod takes to stop, capped by its grace period "
                        "(default 0)")


def real_nodes_argv(args: argparse.Namespace) -> list[str]:
    """``python -m drivers.realnode up`` with this command's flags: the CLI may not import
    a driver (the layering contract), so ``--real`` execs the driver's own entry point."""
    argv = [sys.executable, "-m", "drivers.realnode", "up", "--nodes", args.nodes,
            "--ready-timeout", str(args.ready_timeout), "--log-level", args.log_level]
    for flag, value in (("--kubeconfig", args.kubeconfig), ("--state-dir", args.state_dir),
                        ("--pki-dir", args.pki_dir)):
        if value:
            argv += [flag, value]
    return argv


async def nodes_cmd(args: argparse.Namespace) -> int:
    if args.real:
        import os
        argv = real_nodes_argv(args)
        os.execv(argv[0], argv)
    from controlplane.wiring.sim import run_kubelet_role

    def ready(nodes: tuple[str, ...], server: str) -> None:
        sys.stdout.write(f"kubelets ready: {','.join(nodes)} on {server}\n")
        sys.stdout.flush()

    await run_kubelet_role(
        nodes=tuple(n.strip() for n in args.nodes.split(",") if n.strip()),
        cpu=args.node_cpu, memory=args.node_memory, pods=args.node_pods,
        start_seconds=args.start_seconds, stop_seconds=args.stop_seconds,
        ready_timeout=args.ready_timeout, kubeconfig=args.kubeconfig, context=args.context,
        on_ready=ready, stop=_stop_on_signals(),
        runtime_root=Path(args.runtime_root) if args.runtime_root else None,
        schedule=args.schedule, lazy_runtime=args.lazy_runtime)
    return 0
