"""``cpctl drain`` through the real entry point, in its own process, against a deployment
of separate processes: a drain that moves every pod, and bad input that changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.processes import MARKER, REPO, Deployment, deployed, machines_and_events

pytestmark = pytest.mark.slow


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with deployed(tmp_path) as d:
        yield d


def test_drain_moves_every_pod_and_reports_each_child(deployment: Deployment) -> None:
    d = deployment
    for name in ("a", "b", "c"):
        d.pod(name, "node-1")
    result = d.cpctl("drain", "node-1", "--repository", REPO, "--max-parallel", "2",
                     "--wait", "--wait-seconds", "90", *d.cluster_args())
    assert result.returncode == 0, result.stdout + result.stderr
    drain_id = result.stdout.split()[0]
    assert "drain node-1: 3 pods to move, 0 left alone, at most 2 at a time" in result.stdout
    assert "drain node-1: Succeeded" in result.stdout
    pods = d.pods()
    assert sorted(p["metadata"]["annotations"][MARKER] for p in pods) == ["a=1", "b=1", "c=1"]
    assert all(p["spec"]["nodeName"] != "node-1" for p in pods)
    node = d.api("/api/v1/nodes/node-1")
    assert node["spec"]["unschedulable"] is True

    got = json.loads(d.cpctl("get", drain_id, "-o", "json").stdout)
    children = got["state"]["children"]
    assert sorted(c["name"] for c in children) == ["a", "b", "c"]
    assert {(c["status"], c["phase"]) for c in children} == {("Finished", "Succeeded")}
    history = json.loads(d.cpctl("history", drain_id, "-o", "json").stdout)
    types = [e["type"] for e in history]
    assert types[:4] == ["Submitted", "Started", "CordonRequested", "NodeCordoned"]
    assert types.count("ChildStarted") == types.count("ChildFinished") == 3
    assert types[-1] == "DrainFinished"


def test_drain_refuses_bad_input_with_one_line_and_changes_nothing(
    deployment: Deployment,
) -> None:
    d = deployment
    d.pod("a", "node-1")
    before = machines_and_events(d)
    for args, fragment in [
        (("drain", "node-9"), "unknown node 'node-9'"),
        (("drain", "node-1", "--to", "node-1"), "is the node being drained"),
        (("drain", "node-1", "--to", "node-7"), "--to: unknown node 'node-7'"),
        (("drain", "node-1", "--selector", "app=nothing"), "matches no pod on node"),
        (("drain", "node-1", "--selector", "a b"), "is not KEY=VALUE"),
    ]:
        result = d.cpctl(*args, "--repository", REPO, *d.cluster_args())
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert fragment in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert machines_and_events(d) == before
    assert not d.api("/api/v1/nodes/node-1")["spec"].get("unschedulable")
    assert [p["spec"]["nodeName"] for p in d.pods()] == ["node-1"]
