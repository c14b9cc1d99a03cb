"""Which way a node restores, from the runtime it reports: CRI-O restores checkpoint
images named as the pod's images; agent nodes keep the template's images; containerd and
unknown runtimes are refused (at submission, and per attempt) with a reason naming them."""

from __future__ import annotations

import pytest

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.engine.observation import NodeView, Observation, TagView
from controlplane.machines.base.codec import decode, encode_object
from controlplane.machines.config.classes import class_to_json, parse_class
from controlplane.machines.config.runtimes import RestorePath, restore_path
from controlplane.machines.contract import protocol
from controlplane.machines.stages.restore import (
    ContainerImage,
    RestoreContext,
    RestorePlan,
    runtime_plan,
    start_restore,
)
from controlplane.machines.submission import SubmissionRejected, validate_submission
from tests.machines.machines_gwt import (
    NS,
    POD,
    REPO,
    SRC_NODE,
    SRC_UID,
    TARGET,
    TEMPLATE,
    at,
    digest_of,
    error,
    observe,
    pod,
)

CRIO = "cri-o://1.36.3"
CONTAINERD = "containerd://2.1.4"
ARTIFACT = f"{REPO}@{digest_of('pod manifest')}"
APP_IMAGE = digest_of("app checkpoint image")


def crio_node(name: str, runtime: str = CRIO) -> NodeView:
    return NodeView(name=name, ready=True, runtime=runtime)


def plan(node: str | None = TARGET, artifact: str | None = ARTIFACT) -> RestorePlan:
    return RestorePlan(attempt=1, namespace=NS, pod_name=POD, node=node, artifact=artifact,
                       checkpoint_id="ck-1")


def tag(images: dict[str, str] | None) -> TagView:
    notes = {protocol.MANIFEST_CONTAINER_IMAGES: protocol.format_container_images(images)} \
        if images else {}
    return TagView(ref=ARTIFACT, digest=ARTIFACT.split("@")[1], annotations=notes)


CTX = RestoreContext(template=TEMPLATE, loader=None, schedule_timeout=60,
                     restore_timeout=120, cleanup_timeout=30)


@pytest.mark.parametrize(("runtime", "path"), [
    ("cri-o://1.36.3", RestorePath.RUNTIME), ("CRI-O://1.30.0", RestorePath.RUNTIME),
    ("sim://1", RestorePath.AGENT), ("podman://4.3.1", RestorePath.AGENT),
    ("", RestorePath.AGENT)])
def test_a_node_restores_the_way_its_runtime_allows(runtime: str, path: RestorePath) -> None:
    assert restore_path(runtime) is path


@pytest.mark.parametrize(("runtime", "named"), [
    ("containerd://2.1.4", "containerd://2.1.4 cannot restore"),
    ("docker://27.0.1", "docker://27.0.1 is not one")])
def test_a_runtime_that_cannot_restore_is_named_in_the_refusal(runtime: str,
                                                               named: str) -> None:
    reason = restore_path(runtime)
    assert not isinstance(reason, RestorePath)
    assert named in reason


def test_a_crio_target_restores_each_container_from_its_checkpoint_image() -> None:
    obs = Observation(nodes={TARGET: crio_node(TARGET)},
                      tags={ARTIFACT: tag({"app": APP_IMAGE})})
    planned = runtime_plan(plan(), obs, at(0))
    assert isinstance(planned, RestorePlan)
    assert planned.path == "cri-o"
    assert planned.images == (ContainerImage("app", f"{REPO}@{APP_IMAGE}"),)
    create = start_restore(planned, CTX, at(0), machine_id="m-1").actions[0]
    assert create.params["images"] == {"app": f"{REPO}@{APP_IMAGE}"}


def test_a_crio_target_reads_the_artifacts_manifest_before_it_plans() -> None:
    step = runtime_plan(plan(), Observation(nodes={TARGET: crio_node(TARGET)}), at(0))
    assert not isinstance(step, RestorePlan)
    assert step.needs_tags == frozenset({ARTIFACT})


def test_an_unreadable_node_is_read_again_rather_than_guessed() -> None:
    step = runtime_plan(plan(), Observation(nodes={TARGET: error()}), at(0))
    assert not isinstance(step, RestorePlan)
    assert step.idle
    assert step.wake_at == at(2)


def test_an_agent_target_keeps_the_templates_images() -> None:
    obs = Observation(nodes={TARGET: crio_node(TARGET, "sim://1")})
    planned = runtime_plan(plan(), obs, at(0))
    assert isinstance(planned, RestorePlan)
    assert (planned.path, planned.images) == ("agent", ())
    assert "images" not in start_restore(planned, CTX, at(0), machine_id="m-1").actions[0].params


def test_a_cold_boot_needs_no_runtime() -> None:
    assert runtime_plan(plan(artifact=None), Observation(), at(0)) == plan(artifact=None)


@pytest.mark.parametrize(("runtime", "images", "reason"), [
    (CONTAINERD, {"app": APP_IMAGE}, "containerd://2.1.4 cannot restore"),
    (CRIO, None, "lists none (it was captured by the node agent)")])
def test_an_attempt_a_target_cannot_restore_fails_at_once_without_a_pod(
        runtime: str, images: dict[str, str] | None, reason: str) -> None:
    obs = Observation(nodes={TARGET: crio_node(TARGET, runtime)}, tags={ARTIFACT: tag(images)})
    planned = runtime_plan(plan(), obs, at(0))
    assert isinstance(planned, RestorePlan)
    step = start_restore(planned, CTX, at(0), machine_id="m-1")
    assert [e.type for e in step.events] == ["RestorePodRequested", "RestoreFailed"]
    assert step.events[1].data["reason"] == "RuntimeCannotRestore"
    assert reason in str(step.events[1].data["message"])
    assert step.actions == ()


def test_the_plans_path_and_images_are_recorded_and_old_plans_read_back() -> None:
    planned = RestorePlan(attempt=1, namespace=NS, pod_name=POD, node=TARGET,
                          artifact=ARTIFACT, path="cri-o",
                          images=(ContainerImage("app", f"{REPO}@{APP_IMAGE}"),))
    assert decode(RestorePlan, encode_object(planned)) == planned
    old = encode_object(plan())
    assert "path" not in old
    assert "images" not in old
    assert decode(RestorePlan, old).path == "agent"


def migration(target_runtime: str, source_runtime: str = CRIO) -> Observation:
    return observe({f"{NS}/{POD}": pod()},
                   nodes={SRC_NODE: crio_node(SRC_NODE, source_runtime),
                          TARGET: crio_node(TARGET, target_runtime)})


SPEC: JsonObject = {"pod": {"namespace": NS, "name": POD, "uid": SRC_UID}, "source_node": SRC_NODE,
        "target_node": TARGET, "template": TEMPLATE, "class": {"repository": REPO}}


def test_a_migration_between_crio_nodes_is_accepted() -> None:
    assert validate_submission("migration", SPEC, migration(CRIO))["target_node"] == TARGET


@pytest.mark.parametrize(("target", "source", "message"), [
    (CONTAINERD, CRIO, "spec.target_node: node 'node-b' cannot restore: its runtime "
                       "containerd://2.1.4"),
    (CRIO, CONTAINERD, "spec.source_node: node 'node-a' cannot restore"),
    ("sim://1", CRIO, "a checkpoint moves only between nodes of one kind")])
def test_a_migration_a_runtime_cannot_carry_is_refused_before_anything_is_frozen(
        target: str, source: str, message: str) -> None:
    with pytest.raises(SubmissionRejected, match=message):
        validate_submission("migration", SPEC, migration(target, source))


def test_a_class_maps_a_runtime_name_to_a_path_over_what_the_name_implies() -> None:
    """A CRI-O build that names itself otherwise restores as CRI-O; an operator may send a
    runtime to the agent; the setting is kept in the class's normal form."""
    cls = parse_class({"runtimes": {"my-crio": "cri-o", "cri-o": "agent"}})
    assert restore_path("my-crio://2.0", cls.runtime_paths()) is RestorePath.RUNTIME
    assert restore_path(CRIO, cls.runtime_paths()) is RestorePath.AGENT
    assert class_to_json(cls)["runtimes"] == {"cri-o": "agent", "my-crio": "cri-o"}
    assert "runtimes" not in class_to_json(parse_class({}))
    obs = Observation(nodes={TARGET: crio_node(TARGET, "my-crio://2.0")},
                      tags={ARTIFACT: tag({"app": APP_IMAGE})})
    planned = runtime_plan(plan(), obs, at(0), cls.runtime_paths())
    assert isinstance(planned, RestorePlan)
    assert planned.path == "cri-o"


@pytest.mark.parametrize("runtimes", [{"cri-o": "podman"}, {"CRI O": "agent"}, ["cri-o"]])
def test_a_class_runtime_setting_that_names_no_path_is_refused_with_the_fix(
        runtimes: JsonValue) -> None:
    with pytest.raises(InvalidSpec, match=r"class.runtimes must map a runtime name .* to "
                                          r"one of agent, cri-o"):
        parse_class({"runtimes": runtimes})


def test_a_migration_the_class_sends_to_the_agent_is_not_refused_for_containerd() -> None:
    klass: JsonObject = {"repository": REPO, "runtimes": {"containerd": "agent"}}
    spec: JsonObject = {**SPEC, "class": klass}
    obs = migration(CONTAINERD, CONTAINERD)
    assert validate_submission("migration", spec, obs)["target_node"] == TARGET
