"""A pod whose controller would recreate it is not moved; the reason names the owner."""

from __future__ import annotations

from typing import Any

from controlplane.machines.owners import controller_of, why_not_movable


def pod(*refs: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "shop", "name": "p", "ownerReferences": list(refs)}}


def ref(kind: str, name: str, *, controller: bool = True,
        api_version: str = "apps/v1") -> dict[str, Any]:
    return {"kind": kind, "name": name, "apiVersion": api_version, "uid": "u",
            "controller": controller}


def test_a_bare_pod_moves() -> None:
    assert controller_of({"metadata": {}}) is None
    assert why_not_movable({"metadata": {"name": "p"}}) is None


def test_an_owner_that_is_not_the_controller_does_not_hold_the_pod() -> None:
    assert why_not_movable(pod(ref("ConfigMap", "cfg", controller=False))) is None


def test_each_controller_kind_is_refused_with_its_name_and_what_moving_it_needs() -> None:
    cases = {"ReplicaSet": "adopted by the ReplicaSet",
             "StatefulSet": "scheduling gate",
             "Job": "spec.suspend"}
    for kind, need in cases.items():
        reason = why_not_movable(pod(ref(kind, "web")), verb="migration")
        assert reason is not None
        assert f"owned by {kind} shop/web" in reason
        assert need in reason
        assert "a migration would leave a cold copy" in reason


def test_an_unknown_custom_resource_is_refused_naming_its_kind_and_api_group() -> None:
    reason = why_not_movable(pod(ref("Sandbox", "sb-1", api_version="agents.example.com/v1")))
    assert reason is not None
    assert "owned by Sandbox shop/sb-1" in reason
    assert "a handler for Sandbox (agents.example.com/v1)" in reason


def test_a_daemonset_pod_is_left_because_it_runs_everywhere() -> None:
    reason = why_not_movable(pod(ref("DaemonSet", "logs")))
    assert reason is not None
    assert "DaemonSet shop/logs" in reason
