"""``cpctl sim up`` (the simulated API server) and ``cpctl sim nodes`` (the kubelet role).

The servers themselves are built by the composition root (``wiring.sim``), imported
only when these verbs run, so the other verbs never load the simulator or the role.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

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
kubelets and a scheduler, for tests and demos."""

NODES_EPILOG = """\
examples:
  cpctl sim nodes --kubeconfig admin.kubeconfig --nodes node-1,node-2,node-3
  cpctl sim nodes --kubeconfig var/sim-kubeconfig.yaml --nodes big-1 --node-cpu 64 \\
      --node-memory 256Gi --start-seconds 2 --stop-seconds 1
Against the simulator, start it with its own kubelets off (cpctl sim up --no-kubelets, or
SimCluster(kubelets=False)); both would otherwise schedule the same pods.
See docs/simulator.md.
exit: 0 after SIGTERM/SIGINT, 1 when the nodes cannot be registered in time, 2 on bad input.
"""


async def sim_cmd(args: argparse.Namespace) -> int:
    from controlplane.wiring.sim import run_simulator

    await run_simulator(nodes=args.nodes, port=args.port, kubeconfig=args.kubeconfig,
                        kubelets=args.kubelets)
    return 0


def add_up_parser(verbs: argparse._SubParsersAction[Any]) -> None:
    """``cpctl sim up``: its flags and help."""
    up = verbs.add_parser("up", help="serve a simulated cluster on 127.0.0.1 until SIGTERM "
                          "and write a kubeconfig for it")
    up.add_argument("--nodes", type=int, default=3, help="Ready nodes (default 3)")
    up.add_argument("--kubeconfig", default="var/sim-kubeconfig.yaml",
                    help="where to write the kubeconfig (default var/sim-kubeconfig.yaml)")
    up.add_argument("--port", type=int, default=0, help="port (default: any free one)")
    up.add_argument("--no-kubelets", dest="kubelets", action="store_false",
                    help="no in-process scheduler, kubelets or nodes: run `cpctl sim nodes` "
                    "against it instead")
    up.set_defaults(handler=sim_cmd)


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
    p.add_argument("--node-cpu", default="4", metavar="QTY",
                   help="CPU capacity (= allocatable) of each node (default 4)")
    p.add_argument("--node-memory", default="8Gi", metavar="QTY",
                   help="memory capacity (= allocatable) of each node (default 8Gi)")
    p.add_argument("--node-pods", type=int, default=110, metavar="N",
                   help="pods each node takes (default 110, a kubelet's default)")
    p.add_argument("--start-seconds", type=float, default=0.0, metavar="S",
                   help="how long a pod bound to these nodes takes to turn Running "
                        "(default 0)")
    p.add_argument("--stop-seconds", type=float, default=0.0, metavar="S",
                   help="how long a deleted pod takes to stop, capped by its grace period "
                        "(default 0)")
    p.add_argument("--ready-timeout", type=float, default=60.0, metavar="S",
                   help="give up (exit 1) if the nodes are not Ready within this (default 60)")
    p.add_argument("--no-scheduler", dest="schedule", action="store_false",
                   help="bind nothing: a real kube-scheduler places the pods, the role only "
                        "runs the nodes' kubelets")
    p.add_argument("--runtime-root", default=None, metavar="DIR",
                   help="run pods as real containers: each node is a podman storage root "
                        "DIR/<node> (runc + CRIU; scripts/ensure-criu installs them). "
                        "Default: no containers, status only")
    p.set_defaults(handler=nodes_cmd)


async def nodes_cmd(args: argparse.Namespace) -> int:
    from controlplane.wiring.sim import run_kubelet_role

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def ready(nodes: tuple[str, ...], server: str) -> None:
        sys.stdout.write(f"kubelets ready: {','.join(nodes)} on {server}\n")
        sys.stdout.flush()

    await run_kubelet_role(
        nodes=tuple(n.strip() for n in args.nodes.split(",") if n.strip()),
        cpu=args.node_cpu, memory=args.node_memory, pods=args.node_pods,
        start_seconds=args.start_seconds, stop_seconds=args.stop_seconds,
        ready_timeout=args.ready_timeout, kubeconfig=args.kubeconfig, context=args.context,
        on_ready=ready, stop=stop,
        runtime_root=Path(args.runtime_root) if args.runtime_root else None,
        schedule=args.schedule)
    return 0
