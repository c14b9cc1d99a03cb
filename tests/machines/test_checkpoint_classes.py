"""Checkpoint classes: parsing, validation naming the field, override layering, retention."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.engine.decider import InvalidSpec
from controlplane.machines.config.classes import (
    DEFAULT_CLASS,
    OnFailure,
    Retention,
    StoredArtifact,
    class_to_json,
    parse_class,
    retention_victims,
    tag_for,
)
from controlplane.machines.config.containers import (
    DEFAULT_LOADER,
    DEFAULT_SAVER,
    SOCKET_DIR,
    EnvVar,
    VolumeMount,
)

FULL: dict[str, Any] = {
    "name": "gpu-fast",
    "repository": "registry.example.com/team/ckpt",
    "tag_scheme": "{namespace}-{pod}-{checkpoint_id}",
    "timeouts": {"capture": 1200, "schedule": 60, "restore": 600},
    "retention": {"keep_last": 3, "max_age_seconds": 86400, "delete_after_migration": False},
    "saver": {"image": "my-saver:1", "command": ["save", "--fast"],
              "env": [{"name": "LOG", "value": "debug"}], "env_from_secret": "save-secret",
              "volume_mounts": [{"name": "scratch", "mount_path": "/scratch"}]},
    "loader": {"image": "my-loader:1"},
    "on_failure": "Kill",
    "restore_attempts": 2,
}


def test_missing_class_is_the_default() -> None:
    """No class given: the defaults (resume on failure, delete after migration)."""
    assert parse_class(None) == DEFAULT_CLASS
    assert DEFAULT_CLASS.on_failure is OnFailure.RESUME
    assert DEFAULT_CLASS.retention.delete_after_migration


def test_full_class_parses_and_round_trips_through_its_json() -> None:
    """class_to_json is the normal form: parsing it again gives the same class."""
    cls = parse_class(FULL)
    assert cls.timeouts.capture == 1200
    assert cls.timeouts.release == 120
    assert cls.retention.keep_last == 3
    assert cls.on_failure is OnFailure.KILL
    assert parse_class(class_to_json(cls)) == cls


def test_saver_override_layers_over_the_defaults() -> None:
    """Image and command replace; env merges (user wins); secret and mounts are appended."""
    saver = parse_class(FULL).saver_container()
    assert saver.name == DEFAULT_SAVER.name
    assert saver.image == "my-saver:1"
    assert saver.command == ("save", "--fast")
    assert EnvVar("LOG", "debug") in saver.env
    assert {e.name for e in DEFAULT_SAVER.env} <= {e.name for e in saver.env}
    assert saver.env_from_secrets == ("save-secret",)
    assert saver.volume_mounts == (*DEFAULT_SAVER.volume_mounts, VolumeMount("scratch",
                                                                             "/scratch"))


def test_empty_override_leaves_the_default_container_unchanged() -> None:
    """An empty override object opts into nothing."""
    cls = parse_class({"saver": {}, "loader": {}})
    assert cls.saver_container() == DEFAULT_SAVER
    assert cls.loader_container() == DEFAULT_LOADER


def test_user_env_wins_over_a_default_non_operator_variable() -> None:
    """Env merge is by name, the user's value wins (operator-owned names excepted)."""
    base = DEFAULT_SAVER.env
    cls = parse_class({"saver": {"env": [{"name": "EXTRA", "value": "1"}]}})
    assert cls.saver_container().env == (*base, EnvVar("EXTRA", "1"))


@pytest.mark.parametrize(("patch", "field"), [
    ({"colour": "blue"}, "class has unknown key"),
    ({"name": "Bad Name"}, r"class\.name"),
    ({"repository": "ckpt"}, r"class\.repository"),
    ({"repository": "registry.example.com/team/app:latest"}, r"class\.repository"),
    ({"tag_scheme": "{namespace}-{pod}"}, r"class\.tag_scheme.*checkpoint_id"),
    ({"tag_scheme": "{checkpoint_id}-{user}"}, r"class\.tag_scheme.*user"),
    ({"tag_scheme": "ckpt/{checkpoint_id}"}, r"class\.tag_scheme"),
    ({"tag_scheme": "{checkpoint_id"}, r"class\.tag_scheme"),
    ({"timeouts": {"capture": 0}}, r"class\.timeouts\.capture"),
    ({"timeouts": {"capture": "10m"}}, r"class\.timeouts\.capture"),
    ({"timeouts": {"restore": True}}, r"class\.timeouts\.restore"),
    ({"timeouts": {"schedule": 900, "restore": 300}}, r"class\.timeouts\.schedule"),
    ({"timeouts": {"verify": 10}}, r"class\.timeouts has unknown"),
    ({"retention": {"keep_last": 0}}, r"class\.retention\.keep_last"),
    ({"retention": {"max_age_seconds": 5}}, r"class\.retention\.max_age_seconds"),
    ({"retention": {"delete_after_migration": "yes"}}, r"class\.retention\.delete_after"),
    ({"on_failure": "Pause"}, r"class\.on_failure"),
    ({"on_failure": ["Kill"]}, r"class\.on_failure"),
    ({"restore_attempts": 0}, r"class\.restore_attempts"),
    ({"saver": {"name": "x"}}, r"class\.saver has unknown key.*operator-owned"),
    ({"saver": {"image": ""}}, r"class\.saver\.image"),
    ({"saver": {"image": "a b"}}, r"class\.saver\.image"),
    ({"saver": {"command": []}}, r"class\.saver\.command"),
    ({"saver": {"command": ["ok", ""]}}, r"class\.saver\.command\[1\]"),
    ({"saver": {"env": [{"name": "CHECKPOINT_SOCKET_DIR", "value": "/tmp"}]}},
     r"class\.saver\.env\[0\]\.name.*operator-owned"),
    ({"loader": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}},
     r"class\.loader\.env\[1\]\.name.*twice"),
    ({"loader": {"env": [{"name": "1BAD", "value": "1"}]}}, r"class\.loader\.env\[0\]\.name"),
    ({"loader": {"env": [{"name": "A", "value": 1}]}}, r"class\.loader\.env\[0\]\.value"),
    ({"loader": {"env_from_secret": ""}}, r"class\.loader\.env_from_secret"),
    ({"loader": {"env_from_secret": "Bad_Secret"}}, r"class\.loader\.env_from_secret"),
    ({"loader": {"volume_mounts": [{"name": "x", "mount_path": SOCKET_DIR}]}},
     r"class\.loader\.volume_mounts\[0\]\.mount_path.*operator-owned"),
    ({"loader": {"volume_mounts": [{"name": "x", "mount_path": "/var"}]}},
     r"class\.loader\.volume_mounts\[0\]\.mount_path"),
    ({"loader": {"volume_mounts": [{"name": "checkpoint-socket", "mount_path": "/a"}]}},
     r"class\.loader\.volume_mounts\[0\]\.name"),
    ({"loader": {"volume_mounts": [{"name": "x", "mount_path": "relative"}]}},
     r"class\.loader\.volume_mounts\[0\]\.mount_path"),
    ({"loader": {"volume_mounts": [{"name": "x", "mount_path": "/a"},
                                   {"name": "y", "mount_path": "/a/"}]}},
     r"class\.loader\.volume_mounts\[1\]\.mount_path.*twice"),
    ({"loader": {"volume_mounts": [{"name": "x", "mount_path": "/a", "read_only": "no"}]}},
     r"class\.loader\.volume_mounts\[0\]\.read_only"),
])
def test_nonsense_classes_are_rejected_naming_the_field(patch: dict[str, Any],
                                                        field: str) -> None:
    """Validation refuses each bad class with a message that names the field."""
    with pytest.raises(InvalidSpec, match=field):
        parse_class(patch)


def test_tag_scheme_expands_per_checkpoint_and_falls_back_when_too_long() -> None:
    """Tags embed the checkpoint id; an overflowing expansion falls back to ckpt-<id>."""
    cls = parse_class(FULL)
    assert tag_for(cls, checkpoint_id="c1", namespace="ns", pod="p") == "ns-p-c1"
    long = tag_for(cls, checkpoint_id="c1", namespace="n" * 63, pod="p" * 63)
    assert long == "ckpt-c1"


NOW = datetime(2026, 1, 10, tzinfo=UTC)


def art(ref: str, workload: str, days_ago: int) -> StoredArtifact:
    return StoredArtifact(ref=ref, workload=workload, created_at=NOW - timedelta(days=days_ago))


def test_retention_keeps_the_newest_n_per_workload() -> None:
    """keep_last counts per workload, newest first."""
    arts = [art("a1", "ns/a", 1), art("a2", "ns/a", 2), art("a3", "ns/a", 3),
            art("b1", "ns/b", 5)]
    victims = retention_victims(arts, Retention(keep_last=2), NOW)
    assert [v.ref for v in victims] == ["a3"]


def test_retention_drops_old_artifacts_but_never_protected_ones() -> None:
    """max_age deletes old artifacts unless protected (needed by an active machine)."""
    arts = [art("a1", "ns/a", 1), art("a2", "ns/a", 30), art("a3", "ns/a", 40)]
    victims = retention_victims(arts, Retention(max_age_seconds=7 * 86400), NOW,
                                protected=frozenset({"a3"}))
    assert [v.ref for v in victims] == ["a2"]


@settings(max_examples=40, deadline=None)
@given(keep=st.one_of(st.none(), st.integers(1, 20)), age=st.one_of(
    st.none(), st.integers(60, 10**6)), after=st.booleans(), attempts=st.integers(1, 10))
def test_any_valid_class_round_trips(keep: int | None, age: int | None, after: bool,
                                     attempts: int) -> None:
    """parse_class(class_to_json(c)) == c for any valid class."""
    data = {"retention": {"keep_last": keep, "max_age_seconds": age,
                          "delete_after_migration": after}, "restore_attempts": attempts}
    cls = parse_class(data)
    assert parse_class(class_to_json(cls)) == cls


def test_an_equal_definition_reuses_the_parsed_class_whatever_its_key_order() -> None:
    """initial_state parses the embedded class on every lease: equal JSON, one parse."""
    first = parse_class(FULL)
    again = parse_class(dict(reversed(list(FULL.items()))))
    assert again is first


def test_a_kept_parse_never_lets_a_different_definition_through() -> None:
    """``true`` is not ``1``: after a valid class is kept, an invalid look-alike still fails,
    and each failure names its own caller's field."""
    assert parse_class({"restore_attempts": 1}).restore_attempts == 1
    for field in ("spec.class", "classes[0]"):
        with pytest.raises(InvalidSpec, match=re.escape(f"{field}.restore_attempts")):
            parse_class({"restore_attempts": True}, field=field)
