"""``cpctl sim up``: run the simulated Kubernetes API server (``drivers.sim``).

The CLI is the composition root, the one place in ``controlplane`` allowed to reach into
``drivers`` (import-linter names this edge explicitly); the import is deferred so the
other verbs never load the simulator.
"""

from __future__ import annotations

import argparse


async def sim_cmd(args: argparse.Namespace) -> int:
    from drivers.sim.__main__ import parse_args, serve

    await serve(parse_args(["up", "--nodes", str(args.nodes), "--port", str(args.port),
                            "--kubeconfig", args.kubeconfig]))
    return 0
