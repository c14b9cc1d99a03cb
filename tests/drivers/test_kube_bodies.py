"""Pure pieces of the driver: request bodies, typed views, error mapping, request counts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controlplane.worker.errors import RetryableActionError, TerminalActionError
from drivers.kube import bodies, errors
from drivers.kube.handlers import says_uid_precondition_failed, uid_precondition_failed
from drivers.kube.metrics import RequestCounter
from drivers.kube.views import node_view, pod_view

HOST = "kubernetes.io/hostname"


def test_required_affinity_replaces_any_pin_to_the_old_node() -> None:
    """nodeName, a hostname nodeSelector, hostname expressions and metadata.name fields
    are removed; other constraints are kept and the target is ANDed into each term."""
    spec = {
        "nodeName": "old", "nodeSelector": {HOST: "old", "disk": "ssd"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": HOST, "operator": "In", "values": ["old"]},
                                      {"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In",
                                  "values": ["old"]}]}]}}},
    }
    out = bodies.require_node(spec, "new")
    pin = {"key": HOST, "operator": "In", "values": ["new"]}
    assert "nodeName" not in out
    assert out["nodeSelector"] == {"disk": "ssd"}
    terms = out["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                           pin]},
                     {"matchExpressions": [pin]}]
    assert spec["nodeName"] == "old", "the template is not modified"


def test_restore_pod_merges_action_metadata_over_the_template() -> None:
    pod = bodies.restore_pod(
        namespace="ns", name="p-restored",
        template={"metadata": {"labels": {"app": "a", "tier": "x"}, "annotations": {"k": "1"},
                               "uid": "old-uid"},
                  "spec": {"containers": [{"name": "c", "image": "i"}]}},
        node=None, annotations={"k": "2"}, labels={"app": "b"})
    assert pod["metadata"] == {"name": "p-restored", "namespace": "ns",
                               "labels": {"app": "b", "tier": "x"}, "annotations": {"k": "2"}}
    assert "affinity" not in pod["spec"]


def test_annotation_patch_carries_the_uid_precondition() -> None:
    assert bodies.annotation_patch("u1", {"a": "1", "b": None}) == {
        "metadata": {"uid": "u1", "annotations": {"a": "1", "b": None}}}


def test_event_names_are_deterministic_per_action_key_and_valid() -> None:
    first = bodies.event_name("pod-a", "m1/event/finished")
    assert first == bodies.event_name("pod-a", "m1/event/finished")
    assert first != bodies.event_name("pod-a", "m1/event/failed")
    long = bodies.event_name("x" * 300, "k")
    assert len(long) <= 253
    assert long.startswith("x")
    event = bodies.event_body(namespace="ns", name=first,
                              involved={"kind": "Pod", "name": "pod-a", "uid": None},
                              type_="Normal", reason="Done", message="ok", component="cp",
                              at=datetime(2026, 1, 1, tzinfo=UTC))
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "pod-a",
                                       "namespace": "ns"}
    assert event["firstTimestamp"] == "2026-01-01T00:00:00Z"
    assert event["count"] == 1


def test_views_keep_what_machines_decide_on() -> None:
    pod = pod_view({"metadata": {"namespace": "ns", "name": "p", "uid": "u",
                                 "resourceVersion": "7", "annotations": {"a": "1"},
                                 "deletionTimestamp": "2026-01-01T00:00:00Z"},
                    "spec": {"nodeName": "n1"},
                    "status": {"phase": "Running", "conditions": [
                        {"type": "Ready", "status": "True"}]}})
    assert (pod.uid, pod.node, pod.phase, pod.ready, pod.deleting, pod.resource_version) == (
        "u", "n1", "Running", True, True, "7")
    assert pod_view({"metadata": {"name": "q"}}).phase == "Pending"
    node = node_view({"metadata": {"name": "n1", "labels": {"a": "b"}},
                      "spec": {"unschedulable": True},
                      "status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert (node.ready, node.unschedulable, dict(node.labels)) == (False, True, {"a": "b"})


def test_status_bodies_map_to_typed_errors() -> None:
    def status(code: int, reason: str) -> dict[str, object]:
        return {"kind": "Status", "code": code, "reason": reason, "message": "m"}

    assert type(errors.from_status(409, status(409, "AlreadyExists"), verb="create",
                                   path="/p")) is errors.ApiAlreadyExists
    assert type(errors.from_status(409, status(409, "Conflict"), verb="update",
                                   path="/p")) is errors.ApiConflict
    assert type(errors.from_status(410, status(410, "Expired"), verb="watch",
                                   path="/p")) is errors.ApiGone
    assert type(errors.from_status(504, b"gateway", verb="get", path="/p")) is errors.ApiTimeout
    assert type(errors.from_status(503, "", verb="get", path="/p")) is errors.ApiServerError
    throttled = errors.from_status(429, status(429, "TooManyRequests"), verb="get", path="/p",
                                   retry_after="3")
    assert throttled.retry_after == 3.0
    assert throttled.retryable


def test_action_errors_keep_retryability_and_the_api_reason() -> None:
    forbidden = errors.ApiForbidden("no", status=403, reason="Forbidden")
    busy = errors.ApiServerError("busy", status=500, reason="InternalError")
    terminal, retryable = errors.action_error(forbidden, "x"), errors.action_error(busy, "y")
    assert isinstance(terminal, TerminalActionError)
    assert terminal.error_class == "Forbidden"
    assert isinstance(retryable, RetryableActionError)
    assert retryable.error_class == "InternalError"


def test_request_counts_by_verb_and_since_a_snapshot() -> None:
    counter = RequestCounter()
    counter.sent("list", "pods")
    before = counter.snapshot()
    counter.sent("patch", "pods")
    counter.sent("patch", "pods")
    counter.failed("patch", 409)
    assert counter.since(before) == {"patch": 2}
    assert counter.by_resource[("patch", "pods")] == 2
    assert counter.errors["patch 409"] == 1
    assert list(before) == ["get", "list", "watch", "create", "update", "patch", "delete"]


def test_a_restored_pod_does_not_inherit_the_sources_protocol_annotations() -> None:
    """An inherited restore-failure or capture request would describe the old pod."""
    from controlplane.machines.contract import protocol
    from drivers.kube.bodies import restore_pod

    template = {"metadata": {"annotations": {"team": "a", protocol.PREFIX + "restore-failure":
                                             "x", protocol.PREFIX + "capture-checkpoint-id":
                                             "c1"}},
                "spec": {"containers": [{"name": "m", "image": "i"}]}}
    body = restore_pod(namespace="ns", name="p", template=template, node="n2",
                       annotations={protocol.PREFIX + "restore-artifact": "r@sha256:x"},
                       labels={})
    assert body["metadata"]["annotations"] == {
        "team": "a", protocol.PREFIX + "restore-artifact": "r@sha256:x"}


def test_both_wordings_of_a_failed_uid_precondition_are_recognised() -> None:
    """The registry's wording (what kube-apiserver v1.36 answers a DELETE, captured
    verbatim) and the storage layer's are both a failed UID precondition; a failed
    resourceVersion precondition and an ordinary conflict are not."""
    registry = ('Operation cannot be fulfilled on Pod "web-0": the UID in the precondition '
                "(00000000-0000-0000-0000-000000000000) does not match the UID in record "
                "(0d26505b-e2af-4a1d-af3e-78cef1b8ee9d). The object might have been deleted "
                "and then recreated")
    storage = ('Operation cannot be fulfilled on pods "web-0": Precondition failed: UID in '
               "precondition: 00000000-0000-0000-0000-000000000000, UID in object meta: "
               "0d26505b-e2af-4a1d-af3e-78cef1b8ee9d")
    assert says_uid_precondition_failed(registry)
    assert says_uid_precondition_failed(storage)
    assert not says_uid_precondition_failed(
        'Operation cannot be fulfilled on Pod "web-0": the ResourceVersion in the precondition '
        "(1) does not match the ResourceVersion in record (72). The object might have been "
        "modified")
    assert not says_uid_precondition_failed(
        'Operation cannot be fulfilled on pods "web-0": the object has been modified; please '
        "apply your changes to the latest version and try again")
    conflict = errors.ApiConflict(registry, status=409, reason="Conflict")
    assert uid_precondition_failed(conflict)


TWO = {"spec": {"containers": [{"name": "app", "image": "app:1", "args": ["run"]},
                               {"name": "side", "image": "side:1"}]}}


def test_a_runtime_restored_pod_names_each_containers_checkpoint_image() -> None:
    """CRI-O restores a container whose image is its checkpoint image: the named
    containers get theirs, the others and every other field are kept."""
    body = bodies.restore_pod(namespace="ns", name="p", template=TWO, node="b",
                              annotations={}, labels={},
                              images={"app": "reg/ck@sha256:" + "a" * 64})
    assert body["spec"]["containers"] == [
        {"name": "app", "image": "reg/ck@sha256:" + "a" * 64, "args": ["run"]},
        {"name": "side", "image": "side:1"}]
    assert TWO["spec"]["containers"][0]["image"] == "app:1", "the template is not modified"


def test_a_checkpoint_image_for_a_container_the_pod_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match=r"container\(s\) gone the pod does not have "
                                         r"\(it has app, side\)"):
        bodies.restore_pod(namespace="ns", name="p", template=TWO, node="b", annotations={},
                           labels={}, images={"gone": "reg/ck@sha256:" + "a" * 64})


def test_a_claim_sets_the_checkpoint_images_on_the_whole_container_list() -> None:
    """A merge patch replaces lists: the claim carries every container, as read."""
    pod = {"metadata": {"uid": "u", "resourceVersion": "7"}, **TWO}
    patch = bodies.claim_patch(pod, node="b", gate="g", annotations={"k": "v"},
                               images={"side": "reg/ck@sha256:" + "b" * 64})
    assert [c["image"] for c in patch["spec"]["containers"]] == [
        "app:1", "reg/ck@sha256:" + "b" * 64]
    assert "containers" not in bodies.claim_patch(pod, node="b", gate="g",
                                                  annotations={})["spec"]


def test_a_nodes_view_carries_the_runtime_it_reports() -> None:
    node = {"metadata": {"name": "n"}, "status": {
        "nodeInfo": {"containerRuntimeVersion": "cri-o://1.36.3"},
        "conditions": [{"type": "Ready", "status": "True"}]}}
    assert node_view(node).runtime == "cri-o://1.36.3"
    assert node_view({"metadata": {"name": "n"}}).runtime == ""
