"""A pod whose controller would recreate it is not moved; the reason names the owner."""

from __future__ import annotations

from typing import Any

from controlplane.machines.owners import controller_of, how_moved, why_not_movable


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
    cases = {("ReplicaSet", "suspend"): "scale its Deployment",
             ("StatefulSet", "suspend"): "scale the StatefulSet down",
             ("Job", "migration"): "spec.suspend"}
    for (kind, verb), need in cases.items():
        reason = why_not_movable(pod(ref(kind, "web")), verb=verb)
        assert reason is not None
        assert f"owned by {kind} shop/web" in reason
        assert need in reason
        assert f"a {verb} would leave a cold copy" in reason


def test_a_replicaset_pod_migrates_and_drains_by_adoption() -> None:
    rs_pod = pod(ref("ReplicaSet", "web-5d7f"))
    for verb in ("migrate", "migration", "drain"):
        assert why_not_movable(rs_pod, verb=verb) is None
        assert how_moved(rs_pod, verb=verb) == "adopt"
    assert how_moved({"metadata": {"name": "p"}}) == "bare"
    assert how_moved(rs_pod, verb="migrate", movable=("ReplicaSet",)) == "bare"


def test_a_statefulset_pod_migrates_and_drains_into_its_gated_successor() -> None:
    sts_pod = pod(ref("StatefulSet", "db"))
    for verb in ("migrate", "drain"):
        assert why_not_movable(sts_pod, verb=verb) is None
        assert how_moved(sts_pod, verb=verb) == "gated"
    assert why_not_movable(sts_pod, verb="suspend") is not None


def test_an_unknown_custom_resource_is_refused_naming_its_kind_and_api_group() -> None:
    reason = why_not_movable(pod(ref("Sandbox", "sb-1", api_version="agents.example.com/v1")))
    assert reason is not None
    assert "owned by Sandbox shop/sb-1" in reason
    assert "a handler for Sandbox (agents.example.com/v1)" in reason


def test_a_daemonset_pod_is_left_because_it_runs_everywhere() -> None:
    reason = why_not_movable(pod(ref("DaemonSet", "logs")))
    assert reason is not None
    assert "DaemonSet shop/logs" in reason


def test_a_class_may_declare_an_owner_kind_movable() -> None:
    sandbox = pod(ref("Sandbox", "sb-1", api_version="agents.example.com/v1"))
    assert why_not_movable(sandbox, movable=("Sandbox",)) is None
    assert why_not_movable(pod(ref("Job", "web")), movable=("Sandbox",)) is not None
    reason = why_not_movable(sandbox)
    assert reason is not None
    assert "owners: {Sandbox: move}" in reason  # the refusal says how to declare it


def test_the_class_owners_field_is_validated_naming_the_key() -> None:
    import pytest

    from controlplane.engine.decider import InvalidSpec
    from controlplane.machines.config.classes import class_to_json, parse_class

    parsed = parse_class({"repository": "r.example/x", "owners": {"Sandbox": "move",
                                                                  "Job": "refuse"}})
    assert parsed.movable_owners == ("Sandbox",)
    assert class_to_json(parsed)["owners"] == {"Sandbox": "move"}
    assert "owners" not in class_to_json(parse_class({"repository": "r.example/x"}))
    with pytest.raises(InvalidSpec, match=r"class\.owners\.Sandbox"):
        parse_class({"owners": {"Sandbox": "maybe"}})
