"""``cpctl restore CHECKPOINT --node N`` through the real entry point, in its own process:
a checkpoint restored onto another node keeps the workload's state; bad input (unknown
checkpoint, unknown node, an operation that is not a checkpoint) exits 2, nothing written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.processes import MARKER, REPO, Deployment, deployed, machines_and_events

pytestmark = pytest.mark.slow


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with deployed(tmp_path) as d:
        yield d


def test_restore_puts_a_checkpoint_on_a_node_with_its_state(deployment: Deployment) -> None:
    d = deployment
    d.pod("app", "node-1")
    checkpointed = d.cpctl("checkpoint", "default/app", "--repository", REPO, "--wait",
                           *d.cluster_args())
    assert checkpointed.returncode == 0, checkpointed.stdout + checkpointed.stderr
    checkpoint_id = checkpointed.stdout.split()[0]

    restored = d.cpctl("restore", checkpoint_id, "--node", "node-2", "--name", "app-copy",
                       "--wait", "--wait-seconds", "60", *d.cluster_args())
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "restore default/app-copy on node-2: Succeeded" in restored.stdout
    pods = {p["metadata"]["name"]: p for p in d.pods()}
    assert pods["app-copy"]["spec"]["nodeName"] == "node-2"
    assert pods["app-copy"]["metadata"]["annotations"][MARKER] == "app=1"
    assert pods["app"]["spec"]["nodeName"] == "node-1"  # the source keeps running

    before = machines_and_events(d)
    for args, fragment in [
        (("restore", "no-such-id", "--node", "node-2"), "unknown checkpoint 'no-such-id'"),
        (("restore", checkpoint_id, "--node", "node-9"), "unknown node 'node-9'"),
        (("restore", restored.stdout.split()[0], "--node", "node-2"), "not a checkpoint"),
    ]:
        result = d.cpctl(*args, *d.cluster_args())
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert fragment in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert machines_and_events(d) == before
