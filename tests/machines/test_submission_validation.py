"""Submission validation against an observation, and admission over active operations."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.observation import Observation
from controlplane.machines.submission import (
    ActiveOperation,
    Admit,
    Limits,
    OperationRequest,
    Queue,
    Reject,
    SubmissionRejected,
    SubmissionUnverifiable,
    admission,
    submission_interests,
    validate_submission,
)
from tests.machines.machines_gwt import (
    NS,
    OTHER,
    POD,
    REPO,
    SRC_NODE,
    SRC_UID,
    TARGET,
    TEMPLATE,
    digest_of,
    error,
    node,
    observe,
    pod,
)

KEY = f"{NS}/{POD}"


def migration(**patch: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"pod": {"namespace": NS, "name": POD, "uid": SRC_UID},
                            "source_node": SRC_NODE, "target_node": TARGET,
                            "template": TEMPLATE, "class": {"repository": REPO}}
    body.update(patch)
    return body


def cluster(**pods: Any) -> Observation:
    return observe(pods or {KEY: pod()},
                   nodes={SRC_NODE: node(SRC_NODE), TARGET: node(TARGET)})


def test_interests_name_the_pod_and_both_nodes() -> None:
    """The caller observes exactly what validation needs: the source node too, whose
    runtime a rollback restores with."""
    interests = submission_interests("migration", migration())
    assert interests.pods == frozenset({KEY})
    assert interests.nodes == frozenset({TARGET, SRC_NODE})


def test_good_migration_is_normalised() -> None:
    """A sane request passes and comes back normalised (class embedded)."""
    out = validate_submission("migration", migration(), cluster())
    assert out["target_node"] == TARGET
    assert isinstance(out["class"], dict)


@pytest.mark.parametrize(("obs", "message"), [
    (observe({}, nodes={TARGET: node(TARGET)}), "unknown pod apps/web"),
    (observe({KEY: None}, nodes={TARGET: node(TARGET)}), "unknown pod apps/web"),
    (observe({KEY: pod(uid="other")}, nodes={TARGET: node(TARGET)}), "was recreated"),
    (observe({KEY: pod(phase="Pending")}, nodes={TARGET: node(TARGET)}), "not Running"),
    (observe({KEY: pod(deleting=True)}, nodes={TARGET: node(TARGET)}), "terminating"),
    (observe({KEY: pod()}, nodes={}), "unknown node 'node-b'"),
    (observe({KEY: pod()}, nodes={TARGET: node(TARGET, cordoned=True)}), "cordoned"),
    (observe({KEY: pod()}, nodes={TARGET: node(TARGET, ready=False)}), "NotReady"),
    (observe({KEY: pod(node=OTHER)}, nodes={TARGET: node(TARGET)}), "spec.source_node"),
])
def test_bad_migrations_against_the_cluster_are_rejected(obs: Observation,
                                                         message: str) -> None:
    """Unknown/recreated/non-running pods and missing/cordoned/NotReady nodes are refused."""
    with pytest.raises(SubmissionRejected, match=message):
        validate_submission("migration", migration(), obs)


def test_target_equal_to_current_node_is_rejected() -> None:
    """A checkpoint+restore to the same node is not a migration."""
    with pytest.raises(SubmissionRejected, match="target_node"):
        validate_submission("migration", migration(target_node=SRC_NODE), cluster())


def test_target_equal_to_the_observed_node_is_rejected_even_if_spec_disagrees() -> None:
    """The pod's observed node is authoritative."""
    obs = observe({KEY: pod(node=TARGET)}, nodes={TARGET: node(TARGET)})
    with pytest.raises(SubmissionRejected, match="already runs on"):
        validate_submission("migration", migration(), obs)


@pytest.mark.parametrize("obs", [
    observe({KEY: error()}, nodes={TARGET: node(TARGET)}),
    observe({KEY: pod()}, nodes={TARGET: error()}),
])
def test_probe_errors_make_a_submission_unverifiable_not_rejected(obs: Observation) -> None:
    """An API error is no answer: retry, do not refuse."""
    with pytest.raises(SubmissionUnverifiable, match="retry"):
        validate_submission("migration", migration(), obs)


@pytest.mark.parametrize(("patch", "field"), [
    ({"artifact": "registry.example.com/ckpt"}, "spec.artifact"),
    ({"artifact": f"registry.example.com/ckpt@sha256:{'0' * 64}"}, "spec.artifact"),
    ({"class": {"tag_scheme": "x"}}, "spec.class.tag_scheme"),
    ({"target_node": None}, "spec.target_node"),
    ({"template": {"spec": {}}}, "spec.template"),
])
def test_bad_specs_are_rejected_naming_the_field(patch: dict[str, Any], field: str) -> None:
    """Strict refs and class validation surface as SubmissionRejected naming the field."""
    with pytest.raises(SubmissionRejected, match=field.replace(".", r"\.")):
        validate_submission("migration", migration(**patch), cluster())


def test_restore_requires_a_digest_and_a_schedulable_node() -> None:
    """A restore reads a pinned artifact and targets a usable node."""
    spec = {"artifact": f"{REPO}@{digest_of('x')}", "namespace": NS, "name": "r",
            "node": TARGET, "template": TEMPLATE}
    validate_submission("restore", spec, observe(nodes={TARGET: node(TARGET)}))
    with pytest.raises(SubmissionRejected, match="cordoned"):
        validate_submission("restore", spec,
                            observe(nodes={TARGET: node(TARGET, cordoned=True)}))


def test_checkpoint_of_a_running_pod_is_accepted() -> None:
    """A checkpoint only needs the running pod."""
    spec = {"pod": {"namespace": NS, "name": POD, "uid": SRC_UID}}
    validate_submission("checkpoint", spec, observe({KEY: pod()}))


def test_unknown_kind_is_rejected() -> None:
    """Only product kinds can be submitted here."""
    with pytest.raises(SubmissionRejected, match="unknown kind"):
        validate_submission("teleport", {}, observe())


# --- admission -----------------------------------------------------------------

def op(mid: str, workload: str, source: str | None = SRC_NODE,
       queued: bool = False) -> ActiveOperation:
    return ActiveOperation(machine_id=mid, kind="migration", workload=workload,
                           source_node=source, queued=queued)


REQ = OperationRequest(kind="migration", workload=KEY, source_node=SRC_NODE)


def test_admission_admits_when_nothing_competes() -> None:
    """No active operation: admit."""
    assert admission(REQ, []) == Admit()


@pytest.mark.parametrize("queued", [False, True])
def test_one_active_operation_per_workload(queued: bool) -> None:
    """A second operation on the same workload is rejected, naming the first."""
    result = admission(REQ, [op("m-1", KEY, queued=queued)])
    assert isinstance(result, Reject)
    assert "m-1" in result.reason


def test_cluster_limit_queues_rather_than_refuses() -> None:
    """Over the cluster-wide limit: queue."""
    active = [op(f"m-{i}", f"{NS}/w{i}", source=f"n{i}") for i in range(3)]
    result = admission(REQ, active, Limits(max_cluster=3, max_per_source_node=5))
    assert isinstance(result, Queue)
    assert "cluster limit" in result.reason


def test_source_node_limit_queues() -> None:
    """Over the per-source-node limit: queue; queued operations do not count."""
    active = [op("m-1", f"{NS}/a"), op("m-2", f"{NS}/b"), op("m-3", f"{NS}/c", queued=True)]
    result = admission(REQ, active, Limits(max_cluster=10, max_per_source_node=2))
    assert isinstance(result, Queue)
    assert SRC_NODE in result.reason
    assert admission(REQ, active[:1], Limits(max_per_source_node=2)) == Admit()


@pytest.mark.parametrize("bad", [{"max_cluster": 0}, {"max_per_source_node": -1},
                                 {"max_cluster": True}])
def test_nonsense_limits_are_rejected(bad: dict[str, Any]) -> None:
    """Limits must be positive integers."""
    with pytest.raises(InvalidSpec, match="limits"):
        Limits(**bad)
