"""The retention policy: ``history_keep_days`` in a checkpoint class (validated, named in
its errors, omitted from the normalised JSON while unset so specs stay as they were), and
which days apply to an operation (its class first, then its kind, then the default)."""

from __future__ import annotations

import pytest

from controlplane.engine.decider import InvalidSpec
from controlplane.machines.config.classes import class_to_json, parse_class
from controlplane.store.retention import Policy


def test_a_class_may_keep_history_for_a_number_of_days() -> None:
    cls = parse_class({"name": "gpu", "history_keep_days": 400})
    assert cls.history_keep_days == 400
    assert class_to_json(cls)["history_keep_days"] == 400
    assert parse_class(class_to_json(cls)) == cls


def test_an_unset_history_keep_days_leaves_the_class_json_unchanged() -> None:
    assert "history_keep_days" not in class_to_json(parse_class({"name": "gpu"}))


@pytest.mark.parametrize("value", [-1, "30", 1.5, True, 10**6])
def test_a_bad_history_keep_days_names_the_field(value: object) -> None:
    with pytest.raises(InvalidSpec, match=r"class\.history_keep_days"):
        parse_class({"name": "gpu", "history_keep_days": value})  # type: ignore[dict-item]


def test_the_class_days_win_over_the_kind_and_the_default() -> None:
    policy = Policy(default_days=90, by_kind={"drain": 365})
    assert policy.days_for("migration", {}) == 90
    assert policy.days_for("drain", {}) == 365
    assert policy.days_for("drain", {"class": {"history_keep_days": 7}}) == 7
    assert Policy().days_for("migration", {}) is None
    assert not Policy().configured
