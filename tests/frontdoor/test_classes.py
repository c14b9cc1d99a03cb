"""CheckpointClass resources and checkpoint classes: every class the deploy ships
round-trips through a resource unchanged; a resource's camelCase fields land on the
classes file's keys and parse to the same class; a bad one is refused with the message
naming the resource and the field as its author wrote it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.engine.decider import InvalidSpec
from controlplane.frontdoor.classes import class_from_resource, resource_from_class
from controlplane.machines.config.classes import OnFailure, class_to_json, parse_class

CLASSES = Path(__file__).parents[2] / "deploy/base/controlplane/classes.yaml"
REPO = "registry.example.com/checkpoints"


def shipped() -> list[dict[str, Any]]:
    classes: list[dict[str, Any]] = yaml.safe_load(CLASSES.read_text())["classes"]
    return classes


def resource(name: str = "fast", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "checkpoint.controlplane.dev/v1alpha1", "kind": "CheckpointClass",
            "metadata": {"name": name, "uid": "u-1", "resourceVersion": "7"},
            "spec": {"repository": REPO, **spec}}


@pytest.mark.parametrize("definition", shipped(), ids=lambda d: str(d["name"]))
def test_every_shipped_class_round_trips_through_a_resource(definition: dict[str, Any]) -> None:
    res = resource_from_class(definition)
    assert res["metadata"] == {"name": definition["name"]}
    assert not {k for k in res["spec"] if "_" in k}, "resource fields are camelCase"
    assert class_from_resource(res) == definition
    assert parse_class(class_from_resource(res)) == parse_class(definition)


def test_every_field_of_a_resource_lands_on_the_classes_file_key() -> None:
    saver = {"image": "ghcr.io/acme/saver:v2", "env_from_secret": "saver-creds",
             "volume_mounts": [{"name": "scratch", "mount_path": "/scratch"}]}
    definition = class_from_resource(resource(
        tagScheme="{pod}.{checkpoint_id}", timeouts={"capture": 120, "restore": 600},
        retention={"keepLast": 3, "maxAgeSeconds": 3600, "deleteAfterMigration": False},
        saver=saver, loader={"command": ["load", "--fast"]}, onFailure="Kill",
        restoreAttempts=5, owners={"Sandbox": "move", "Job": "refuse"}, historyKeepDays=30,
        runtimes={"my-crio": "cri-o"}))
    assert definition == {
        "name": "fast", "repository": REPO, "tag_scheme": "{pod}.{checkpoint_id}",
        "timeouts": {"capture": 120, "restore": 600},
        "retention": {"keep_last": 3, "max_age_seconds": 3600,
                      "delete_after_migration": False},
        "saver": saver, "loader": {"command": ["load", "--fast"]}, "on_failure": "Kill",
        "restore_attempts": 5, "owners": {"Sandbox": "move", "Job": "refuse"},
        "history_keep_days": 30, "runtimes": {"my-crio": "cri-o"}}
    klass = parse_class(definition)
    assert (klass.name, klass.on_failure, klass.retention.keep_last) == \
        ("fast", OnFailure.KILL, 3)
    assert klass.saver.volume_mounts[0].mount_path == "/scratch"
    assert klass.movable_owners == ("Sandbox",)
    assert klass.runtime_paths() == {"my-crio": "cri-o"}


def test_a_normalised_class_becomes_a_resource_without_nulls_and_parses_the_same() -> None:
    normal = class_to_json(parse_class({"name": "plain", "repository": REPO}))
    res = resource_from_class(normal)

    def nulls(value: Any) -> bool:
        if isinstance(value, dict):
            return any(nulls(v) for v in value.values())
        return value is None

    assert not nulls(res["spec"])
    assert parse_class(class_from_resource(res)) == parse_class(normal)


@pytest.mark.parametrize(("spec", "says"), [
    ({"tagScheme": "{namespace}.{pod}"},
     "CheckpointClass fast: spec.tagScheme '{namespace}.{pod}' must contain '{checkpoint_id}'"),
    ({"retention": {"keepLast": 0}}, "CheckpointClass fast: spec.retention.keepLast must be "),
    ({"retention": {"maxAgeSeconds": 1}}, "spec.retention.maxAgeSeconds must be from 60"),
    ({"retention": {"deleteAfterMigration": "yes"}},
     "spec.retention.deleteAfterMigration must be true or false"),
    ({"onFailure": "Stop"}, "spec.onFailure must be 'Resume' or 'Kill', got 'Stop'"),
    ({"restoreAttempts": 11}, "spec.restoreAttempts must be from 1 to 10"),
    ({"historyKeepDays": "30"}, "spec.historyKeepDays must be a whole number of days"),
    ({"timeouts": {"schedule": 900, "restore": 60}},
     "spec.timeouts.schedule (900) must not exceed spec.timeouts.restore (60)"),
    ({"owners": {"Sandbox": "adopt"}}, "spec.owners.Sandbox: 'adopt' is not 'move'"),
    ({"saver": {"volume_mounts": [{"name": "x", "mount_path": "rel"}]}},
     "spec.saver.volume_mounts[0].mount_path must be an absolute path"),
    ({"loader": {"env": [{"name": "CHECKPOINT_ID", "value": "x"}]}},
     "spec.loader.env[0].name 'CHECKPOINT_ID' is operator-owned"),
    ({"repository": "Not A Repo"}, "CheckpointClass fast: spec.repository "),
], ids=lambda v: "" if isinstance(v, str) else next(iter(v)))
def test_a_bad_field_is_refused_naming_it_as_the_resource_spells_it(
        spec: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        class_from_resource(resource(**spec))
    assert says in str(refused.value)
    assert not {"tag_scheme", "keep_last", "on_failure", "restore_attempts",
                "history_keep_days"} & set(str(refused.value).replace(",", " ").split())


def test_a_classes_file_spelling_in_a_resource_is_an_unknown_field() -> None:
    with pytest.raises(InvalidSpec, match=r"spec has unknown field\(s\) tag_scheme; known: "
                                          r"encryption, historyKeepDays, .*tagScheme"):
        class_from_resource(resource(tag_scheme="{checkpoint_id}"))
    with pytest.raises(InvalidSpec, match=r"spec.retention has unknown field\(s\) keep_last"):
        class_from_resource(resource(retention={"keep_last": 2}))


@pytest.mark.parametrize(("obj", "says"), [
    (resource("Fast"), "CheckpointClass Fast: metadata.name must be a lowercase DNS label"),
    ({"metadata": {}, "spec": {"repository": REPO}}, "CheckpointClass: metadata.name is"),
    ({"metadata": {"name": "fast"}}, "CheckpointClass fast: spec must be an object"),
    ({"metadata": {"name": "fast"}, "spec": {}}, "CheckpointClass fast: spec.repository is "
                                                 "required"),
], ids=["bad-name", "no-name", "no-spec", "no-repository"])
def test_a_resource_without_a_usable_name_or_repository_is_refused(
        obj: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        class_from_resource(obj)
    assert says in str(refused.value)
