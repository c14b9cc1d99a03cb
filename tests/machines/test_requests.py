"""The requests each kind builds from a door's plain fields: a bad or unknown field is
refused naming it as that door spells it, and the spec is built from what was read."""

from __future__ import annotations

import pytest

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base.requests import (
    Fields,
    Found,
    Lookups,
    Seen,
    SubmissionRejected,
)
from controlplane.machines.catalog import kinds, requested_kinds
from controlplane.machines.migration.request import MigrationRequest, MigrationRequests

KLASS = {"repository": "localhost:5000/ckpt"}
CLI = {"targetNode": "--to", "keepCheckpoint": "--keep-checkpoint", "name": "--name"}
RESOURCE = {"workload": "spec.podName", "targetNode": "spec.targetNodeName",
            "keepCheckpoint": "spec.keepCheckpoint"}
POD: JsonObject = {"metadata": {"namespace": "default", "name": "web", "uid": "u-1", "labels": {}},
       "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "app:1"}]}}


def migration(spelled: dict[str, str] | None = None, **fields: object) -> MigrationRequest:
    values = {"workload": "default/web", "targetNode": "node-2", "class": KLASS, **fields}
    return MigrationRequests().of(Fields(values, spelled))


def test_every_kind_operators_ask_for_has_a_request_and_a_view() -> None:
    assert requested_kinds() == ["checkpoint", "restore", "migration", "suspend", "resume",
                                 "drain"]
    for kind in kinds().values():
        assert kind.view.success, kind.name


@pytest.mark.parametrize(("spelled", "named"), [(CLI, "--keep-checkpoint"),
                                                (RESOURCE, "spec.keepCheckpoint"),
                                                (None, "keepCheckpoint")])
def test_a_bad_value_is_refused_naming_the_field_as_the_door_spells_it(
        spelled: dict[str, str] | None, named: str) -> None:
    with pytest.raises(SubmissionRejected, match=f"^{named}: must be true or false") as err:
        migration(spelled, keepCheckpoint="yes")
    assert err.value.field == named


def test_a_field_the_request_does_not_take_is_refused_not_ignored() -> None:
    with pytest.raises(SubmissionRejected, match="quiesce: is not a field of this request"):
        migration(quiesce=True)


def test_a_missing_field_says_what_to_give() -> None:
    with pytest.raises(SubmissionRejected, match="--to: is required") as err:
        MigrationRequests().of(Fields({"workload": "default/web", "class": KLASS}, CLI))
    assert err.value.hint == "name the node to move the pod to"


def test_the_migration_spec_is_built_from_the_pod_read_once() -> None:
    request = migration(keepCheckpoint=True)
    assert request.lookups() == Lookups()  # nothing in the store
    assert request.reads(Found()).pods == {"default/web"}
    spec = request.build(Seen(pods={"default/web": POD})).spec
    assert spec["pod"] == {"namespace": "default", "name": "web", "uid": "u-1"}
    assert (spec["source_node"], spec["target_node"]) == ("node-1", "node-2")
    assert spec["keep_checkpoint"] is True
    assert spec["keep_name"] is True  # a bare pod keeps its name
    assert "keep_checkpoint" not in migration().build(Seen(pods={"default/web": POD})).spec


def test_a_pod_that_is_not_there_is_refused_naming_the_workload() -> None:
    with pytest.raises(SubmissionRejected, match=r"spec\.podName: pod default/web not found"):
        migration(RESOURCE).build(Seen(pods={"default/web": None}))
