"""``python -m drivers.sim up --nodes 3 --kubeconfig PATH``: run the simulator as a process.

Starts a :class:`~drivers.sim.cluster.SimCluster` on loopback, writes a kubeconfig
pointing at it (if asked), installs the standing faults of ``--fault`` flags (see
:mod:`drivers.sim.faultspec`; ``--seed`` fixes their random sequence), prints one line
saying where it listens, and runs until SIGTERM or SIGINT. Called by operators, demos,
fault campaigns, ``cpctl sim up`` and the process-level tests.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

from drivers.sim import faultspec
from drivers.sim.cluster import SimCluster


def _fault(text: str) -> faultspec.FaultSpec:
    try:
        return faultspec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m drivers.sim",
                                     description="A simulated Kubernetes API server.")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="serve a simulated cluster until SIGTERM")
    up.add_argument("--nodes", type=int, default=3, help="how many Ready nodes (default 3)")
    up.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any)")
    up.add_argument("--kubeconfig", help="write a kubeconfig pointing at the simulator here")
    up.add_argument("--node-cpu", default="4", help="allocatable CPU per node (default 4)")
    up.add_argument("--node-memory", default="8Gi", help="allocatable memory per node")
    up.add_argument("--node-pods", type=int, default=110,
                    help="allocatable pods per node (default 110, as a kubelet's default)")
    up.add_argument("--start-seconds", type=float, default=0.0,
                    help="how long a scheduled pod takes to become Running (default 0)")
    up.add_argument("--stop-seconds", type=float, default=0.0,
                    help="how long a deleted pod takes to stop, capped by its grace period")
    up.add_argument("--fault", type=_fault, action="append", default=[], metavar="SPEC",
                    help="a standing fault, e.g. error,verb=patch,rate=0.1,code=503 or "
                         "latency,seconds=0.05 or drop-watches,rate=0.01 or "
                         "conflicts,name=app,seconds=30 or forbid,verb=delete,resource=pods "
                         "(repeatable; see docs/simulator.md)")
    up.add_argument("--seed", type=int, default=0,
                    help="seed of the faults' random sequence (default 0)")
    up.add_argument("--no-kubelets", dest="kubelets", action="store_false",
                    help="no in-process scheduler, kubelets or nodes: leave them to the "
                         "kubelet role (cpctl sim nodes)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with SimCluster(nodes=args.nodes, port=args.port, node_cpu=args.node_cpu,
                          node_memory=args.node_memory, node_pods=args.node_pods,
                          start_seconds=args.start_seconds,
                          stop_seconds=args.stop_seconds, seed=args.seed,
                          kubelets=args.kubelets) as cluster:
        for spec in args.fault:
            spec.install(cluster.faults)
        nodes = f"{args.nodes} nodes" if args.kubelets else "no nodes, no kubelets"
        where = f"simulated cluster listening on {cluster.url} ({nodes})"
        if args.fault:
            where += f", {len(args.fault)} standing fault(s), seed {args.seed}"
        if args.kubeconfig:
            path = cluster.write_kubeconfig(args.kubeconfig)
            where += f"; kubeconfig: {path}"
        print(where, flush=True)
        await stop.wait()
    print("simulated cluster stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
