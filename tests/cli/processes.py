"""A deployment in separate processes for the drain and restore verbs: ``cpctl sim up``, a
node agent per node, ``cpctl worker`` with room for parallel children (the drain's
children are admitted under the worker's limits). Reuses
:class:`tests.support.process_deployment.Deployment`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from tests.support.process_deployment import MARKER, REPO, Deployment

__all__ = ["MARKER", "REPO", "Deployment", "deployed"]


@contextlib.contextmanager
def deployed(tmp_path: Path, *, nodes: int = 3) -> Iterator[Deployment]:
    d = Deployment(tmp_path)
    try:
        sim = d.start("sim", "controlplane.cli.main", "sim", "up", "--nodes", str(nodes),
                      "--kubeconfig", str(d.kubeconfig))
        assert sim.stdout is not None
        d.url = sim.stdout.readline().split("listening on ")[1].split()[0]
        for i in range(1, nodes + 1):
            node = f"node-{i}"
            d.agents[node] = agent = d.start(
                f"agent-{node}", "drivers.agent", "--node", node, "--kubeconfig",
                str(d.kubeconfig), "--layout", str(d.layout), "--dumper", "sim",
                "--workdir", str(tmp_path / "work" / node))
            assert agent.stdout is not None
            assert agent.stdout.readline()  # one line once it serves
        assert d.cpctl("db", "upgrade").returncode == 0
        d.start("worker", "controlplane.cli.main", "--db", d.db, "worker", "--poll-seconds",
                "0.05", "--max-operations", "10", "--max-per-node", "4", *d.cluster_args())
        yield d
    finally:
        d.stop()


def machines_and_events(d: Deployment) -> tuple[int, int]:
    """How many machines and events the database holds (``cpctl list`` + history)."""
    listed = json.loads(d.cpctl("list", "--limit", "1000", "-o", "json").stdout)["items"]
    events = sum(len(json.loads(d.cpctl("history", m["id"], "-o", "json").stdout))
                 for m in listed)
    return len(listed), events
