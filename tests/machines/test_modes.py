"""Migration modes: the field each door spells, the class's default, what reaches the
agent in the capture request, and what a node kind refuses before anything is frozen."""

from __future__ import annotations

import pytest

from controlplane.cli.main import MIGRATION_MODES
from controlplane.engine.decider import InvalidSpec
from controlplane.engine.observation import NodeView
from controlplane.machines.base.requests import Fields, Seen, SubmissionRejected
from controlplane.machines.config.classes import class_to_json, parse_class
from controlplane.machines.config.modes import (
    MigrationMode,
    lazy_checkpoint_images,
    mode_refusal,
    parse_mode,
)
from controlplane.machines.config.runtimes import RestorePath
from controlplane.machines.contract import protocol
from controlplane.machines.migration.machine import MigrationDecider
from controlplane.machines.migration.request import MigrationRequests
from tests.machines.machines_gwt import NS, POD, T0, Given, migration_body, observe, pod

MID = "mig-1"
KLASS = {"repository": "localhost:5000/ckpt"}
POD_SEEN = {"metadata": {"namespace": "default", "name": "web", "uid": "u-1", "labels": {}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "app:1"}]}}


def capture_annotations(spec_extra: dict[str, object], **klass: object) -> dict[str, str]:
    d = MigrationDecider()
    g = Given(d, MID, d.validate_spec(migration_body(klass, **spec_extra)))
    [ask] = [a for a in g.when(observe({f"{NS}/{POD}": pod()}), T0).actions
             if a.type == "AnnotatePod"]
    notes = ask.params["annotations"]
    assert isinstance(notes, dict)
    return {str(k): str(v) for k, v in notes.items()}


def test_the_cli_offers_exactly_the_modes_there_are() -> None:
    assert tuple(m.value for m in MigrationMode) == MIGRATION_MODES


def test_an_unknown_mode_is_refused_naming_the_field_and_every_mode() -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.mode 'live' is not a migration mode "
                                          r"\('stop-and-copy': .*; 'precopy': "):
        parse_mode("live", field="spec.mode")


@pytest.mark.parametrize(("spelled", "named"), [({"mode": "--mode"}, "--mode"),
                                                ({"mode": "spec.mode"}, "spec.mode")])
def test_a_bad_mode_is_refused_naming_the_field_as_the_door_spells_it(
        spelled: dict[str, str], named: str) -> None:
    fields = Fields({"workload": "default/web", "targetNode": "node-2", "class": KLASS,
                     "mode": "fast"}, spelled)
    with pytest.raises(SubmissionRejected, match=f"^{named}: 'fast' is not a migration mode"):
        MigrationRequests().of(fields).build(Seen(pods={"default/web": POD_SEEN}))


def test_a_named_mode_goes_into_the_spec_and_an_unnamed_one_is_left_to_the_class() -> None:
    def spec(**extra: object) -> dict[str, object]:
        fields = Fields({"workload": "default/web", "targetNode": "node-2", "class": KLASS,
                         **extra})
        return dict(MigrationRequests().of(fields).build(Seen(pods={"default/web": POD_SEEN}))
                    .spec)
    assert spec(mode="precopy")["mode"] == "precopy"
    assert "mode" not in spec()


def test_precopy_reaches_the_agent_bound_to_its_checkpoint() -> None:
    notes = capture_annotations({"mode": "precopy"})
    assert protocol.capture_mode(notes, MID) == "precopy"
    assert protocol.capture_mode(notes, "an-earlier-checkpoint") == ""


def test_the_class_mode_applies_unless_the_migration_names_its_own() -> None:
    assert protocol.capture_mode(capture_annotations({}, migration_mode="precopy"), MID) \
        == "precopy"
    named = capture_annotations({"mode": "stop-and-copy"}, migration_mode="precopy")
    assert protocol.CAPTURE_MODE not in named


def test_stop_and_copy_asks_exactly_as_before_modes_existed() -> None:
    assert protocol.CAPTURE_MODE not in capture_annotations({})


def test_a_class_mode_survives_its_normal_form_and_a_bad_one_names_the_key() -> None:
    klass = parse_class({**KLASS, "migration_mode": "precopy"})
    assert klass.migration_mode is MigrationMode.PRECOPY
    assert parse_class(class_to_json(klass)) == klass
    assert "migration_mode" not in class_to_json(parse_class(KLASS))
    with pytest.raises(InvalidSpec, match=r"class\.migration_mode 'live' is not a migration"):
        parse_class({**KLASS, "migration_mode": "live"})


def test_a_cri_o_node_refuses_precopy_and_takes_stop_and_copy() -> None:
    why = mode_refusal(MigrationMode.PRECOPY, RestorePath.RUNTIME, node="node-2")
    assert why is not None
    assert "CRI-O" in why
    assert "stop-and-copy" in why
    assert mode_refusal(MigrationMode.STOP_AND_COPY, RestorePath.RUNTIME, node="n") is None
    assert mode_refusal(MigrationMode.PRECOPY, RestorePath.AGENT, node="n") is None


def test_an_unreadable_mode_annotation_is_an_error_not_a_default() -> None:
    with pytest.raises(ValueError, match="capture-mode"):
        protocol.capture_mode({protocol.CAPTURE_MODE: "precopy"}, MID)


def test_a_precopy_migration_between_cri_o_nodes_is_refused_at_submission() -> None:
    fields = Fields({"workload": "default/web", "targetNode": "node-2", "class": KLASS,
                     "mode": "precopy"})
    spec = MigrationRequests().of(fields).build(Seen(pods={"default/web": POD_SEEN})).spec
    crio = "cri-o://1.36.3"
    seen = observe({"default/web": pod("web", uid="u-1", node="node-1")},
                   nodes={n: NodeView(name=n, ready=True, runtime=crio)
                          for n in ("node-1", "node-2")})
    with pytest.raises(SubmissionRejected, match=r"spec\.mode: mode 'precopy' needs CRIU "
                                                 r"driven by the node agent"):
        MigrationRequests().check(spec, seen)
    MigrationRequests().check({**spec, "mode": "stop-and-copy"}, seen)  # takes it


def test_a_lazy_hand_over_image_sits_beside_the_capture_tag_one_per_container() -> None:
    """``registry:port/repo:tag`` keeps its registry port; the tag names the checkpoint
    and the container (the target's agent pushes there, the restore pod names it)."""
    assert lazy_checkpoint_images("localhost:5000/ckpt/web:ck-1", "ck-1", ("app", "side")) == {
        "app": "localhost:5000/ckpt/web:lazy-ck-1-app",
        "side": "localhost:5000/ckpt/web:lazy-ck-1-side"}
