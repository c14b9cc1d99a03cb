"""The restore gate's pure admission decisions: which reviews are looked up, and the
AdmissionReview v1 answer (always allowed; the gate patched in only for an operation)."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from controlplane.app.successor_gate import admission_response, gate_patch, needs_gate_lookup
from controlplane.machines.contract.protocol import RESTORE_GATE
from tests.support.admission_reviews import STS_REF, review


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["response"]["patch"]))
    return patch


def apply(pod: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """The two JSONPatch "add" forms the gate uses, applied as the API server would."""
    pod = copy.deepcopy(pod)
    for op in patch:
        assert op["op"] == "add"
        *parents, last = op["path"].strip("/").split("/")
        target = pod
        for part in parents:
            target = target[part]
        if last == "-":
            target.append(op["value"])
        else:
            target[last] = op["value"]
    return pod


def test_a_created_statefulset_pod_is_looked_up_by_namespace_and_name() -> None:
    assert needs_gate_lookup(review()) == ("prod", "db-0")


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_creation_is_looked_up(operation: str) -> None:
    assert needs_gate_lookup(review(operation=operation)) is None


@pytest.mark.parametrize("owners", [
    [],
    [{**STS_REF, "controller": False}],
    [{**STS_REF, "kind": "ReplicaSet"}],
    [{**STS_REF, "apiVersion": "example.com/v1"}],  # a CRD that happens to be named so
    [{k: v for k, v in STS_REF.items() if k != "controller"}],
], ids=["no-owner", "not-controller", "replicaset", "other-group", "controller-unset"])
def test_a_pod_without_a_statefulset_controller_is_not_looked_up(
    owners: list[dict[str, Any]],
) -> None:
    assert needs_gate_lookup(review(owners=owners)) is None


def test_a_statefulset_controller_among_other_owners_is_found() -> None:
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-x"}
    assert needs_gate_lookup(review(owners=[other, STS_REF])) == ("prod", "db-0")


def test_a_pod_without_a_name_takes_the_request_name_or_is_not_looked_up() -> None:
    assert needs_gate_lookup(review(name=None, request_name="db-1")) == ("prod", "db-1")
    assert needs_gate_lookup(review(name=None)) is None


def test_another_resource_or_a_subresource_is_not_looked_up() -> None:
    assert needs_gate_lookup(review(kind="Deployment")) is None
    r = review()
    r["request"]["subResource"] = "binding"
    assert needs_gate_lookup(r) is None


def test_a_malformed_review_is_not_looked_up() -> None:
    assert needs_gate_lookup({}) is None
    assert needs_gate_lookup({"request": "nonsense"}) is None
    assert needs_gate_lookup({"request": {"operation": "CREATE", "kind": {"kind": "Pod"},
                                          "object": {"metadata": []}}}) is None


def test_without_an_operation_the_pod_is_allowed_unchanged_and_the_uid_echoed() -> None:
    out = admission_response(review(), None)
    assert out["apiVersion"] == "admission.k8s.io/v1"
    assert out["kind"] == "AdmissionReview"
    assert out["response"] == {"uid": "req-1", "allowed": True}


def test_with_an_operation_the_gate_list_is_created_and_the_operation_named() -> None:
    r = review()
    out = admission_response(r, "mig-7")["response"]
    assert out["allowed"] is True
    assert out["uid"] == "req-1"
    assert out["patchType"] == "JSONPatch"
    assert patch_of({"response": out}) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": RESTORE_GATE}]}]
    assert "mig-7" in out["auditAnnotations"]["restore-gate"]
    assert any("mig-7" in w for w in out["warnings"])
    assert apply(r["request"]["object"], patch_of({"response": out}))["spec"][
        "schedulingGates"] == [{"name": RESTORE_GATE}]


def test_existing_gates_are_kept_and_the_restore_gate_appended() -> None:
    r = review(spec={"containers": [], "schedulingGates": [{"name": "example.com/quota"}]})
    patch = patch_of(admission_response(r, "mig-7"))
    assert patch == [{"op": "add", "path": "/spec/schedulingGates/-",
                      "value": {"name": RESTORE_GATE}}]
    assert apply(r["request"]["object"], patch)["spec"]["schedulingGates"] == [
        {"name": "example.com/quota"}, {"name": RESTORE_GATE}]


@pytest.mark.parametrize("gates", [None, []])
def test_a_null_or_empty_gate_list_is_replaced_by_one_with_the_gate(gates: Any) -> None:
    assert gate_patch({"spec": {"schedulingGates": gates}}) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": RESTORE_GATE}]}]


def test_a_pod_that_already_has_the_gate_gets_no_patch() -> None:
    r = review(spec={"containers": [], "schedulingGates": [{"name": RESTORE_GATE}]})
    out = admission_response(r, "mig-7")["response"]
    assert "patch" not in out
    assert out["allowed"] is True


def test_a_pod_bound_to_a_node_is_allowed_ungated_with_a_warning() -> None:
    """A gate on a pod with ``spec.nodeName`` would make the API server refuse the pod;
    the webhook never causes a refusal, so it says why it did not gate instead."""
    out = admission_response(review(spec={"containers": [], "nodeName": "n1"}), "mig-7")
    assert "patch" not in out["response"]
    assert out["response"]["allowed"] is True
    assert any("nodeName" in w and "mig-7" in w for w in out["response"]["warnings"])


def test_a_given_warning_is_passed_on_without_a_patch() -> None:
    out = admission_response(review(), None, warning="lookup timed out")["response"]
    assert out == {"uid": "req-1", "allowed": True, "warnings": ["lookup timed out"]}


def test_the_answer_is_a_pure_function_of_the_review() -> None:
    r = review()
    before = copy.deepcopy(r)
    assert admission_response(r, "mig-7") == admission_response(r, "mig-7")
    assert r == before
