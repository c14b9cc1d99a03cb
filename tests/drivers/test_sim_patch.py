"""The simulator's patch and selector semantics (pure): what a real API server does."""

from __future__ import annotations

from typing import Any

import pytest

from drivers.sim import selectors
from drivers.sim.patch import PatchError, json_patch, merge_patch, strategic_merge_patch

POD: dict[str, Any] = {"metadata": {"name": "p", "uid": "u1", "labels": {"app": "a"},
                    "annotations": {"keep": "1", "drop": "2"}, "finalizers": ["f1"]},
       "spec": {"containers": [{"name": "a", "image": "i1"}, {"name": "b", "image": "i2"}],
                "tolerations": [{"key": "t"}]}}


def test_merge_patch_merges_maps_deletes_nulls_and_replaces_lists() -> None:
    out = merge_patch(POD, {"metadata": {"annotations": {"drop": None, "new": "3"}},
                            "spec": {"containers": [{"name": "c", "image": "i3"}]}})
    assert out["metadata"]["annotations"] == {"keep": "1", "new": "3"}
    assert out["spec"]["containers"] == [{"name": "c", "image": "i3"}]
    assert POD["metadata"]["annotations"]["drop"] == "2", "the input is untouched"


def test_strategic_merge_patch_merges_lists_by_their_key() -> None:
    out = strategic_merge_patch(POD, {
        "metadata": {"finalizers": ["f2"], "annotations": {"drop": None}},
        "spec": {"containers": [{"name": "b", "image": "i9"}, {"name": "c", "image": "i3"}],
                 "tolerations": [{"key": "u"}]}})
    assert [c["image"] for c in out["spec"]["containers"]] == ["i1", "i9", "i3"]
    assert out["metadata"]["finalizers"] == ["f1", "f2"]
    assert out["metadata"]["annotations"] == {"keep": "1"}
    assert out["spec"]["tolerations"] == [{"key": "u"}], "no merge key: replaced"


def test_strategic_merge_patch_directives() -> None:
    out = strategic_merge_patch(POD, {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"],
                     "labels": {"$patch": "replace", "only": "this"}},
        "spec": {"containers": [{"name": "a", "$patch": "delete"}],
                 "$setElementOrder/containers": [{"name": "b"}]}})
    assert out["metadata"]["finalizers"] == []
    assert out["metadata"]["labels"] == {"only": "this"}
    assert [c["name"] for c in out["spec"]["containers"]] == ["b"]


def test_json_patch_applies_every_operation_or_none() -> None:
    out = json_patch(POD, [
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "add", "path": "/metadata/annotations/a~1b", "value": "x"},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "i0"},
        {"op": "remove", "path": "/metadata/annotations/drop"},
        {"op": "copy", "from": "/metadata/name", "path": "/metadata/labels/name"},
        {"op": "move", "from": "/metadata/labels/app", "path": "/metadata/labels/moved"},
        {"op": "add", "path": "/spec/containers/-", "value": {"name": "z", "image": "iz"}},
    ])
    assert out["metadata"]["annotations"] == {"keep": "1", "a/b": "x"}
    assert out["metadata"]["labels"] == {"name": "p", "moved": "a"}
    assert [c["name"] for c in out["spec"]["containers"]] == ["a", "b", "z"]
    assert out["spec"]["containers"][0]["image"] == "i0"


@pytest.mark.parametrize(("ops", "code"), [
    ([{"op": "test", "path": "/metadata/uid", "value": "other"}], 422),
    ([{"op": "test", "path": "/metadata/missing", "value": "x"}], 422),
    ([{"op": "add", "path": "/metadata/nope/deeper", "value": 1}], 422),
    ([{"op": "remove", "path": "/metadata/annotations/never"}], 422),
    ([{"op": "jump", "path": "/x"}], 400),
    ({"op": "add"}, 400),
])
def test_json_patch_refusals(ops: object, code: int) -> None:
    with pytest.raises(PatchError) as caught:
        json_patch(POD, ops)
    assert caught.value.code == code


@pytest.mark.parametrize(("label_selector", "field_selector", "expected"), [
    ("app=a", None, True), ("app==a,tier", None, False), ("app!=a", None, False),
    ("app in (a, b)", None, True), ("app notin (a)", None, False), ("!tier", None, True),
    (None, "metadata.name=p,spec.nodeName=n1", True), (None, "spec.nodeName!=n1", False),
    (None, "status.phase=Running", True), ("app", "metadata.namespace=ns", True),
])
def test_selectors_match_like_the_api_server(label_selector: str | None,
                                             field_selector: str | None,
                                             expected: bool) -> None:
    obj = {"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "a"}},
           "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    assert selectors.parse(label_selector, field_selector).matches(obj) is expected


@pytest.mark.parametrize(("label_selector", "field_selector"), [
    ("app in a", None), ("a=b c", None), (None, "spec.image=x"), (None, "noop"),
])
def test_malformed_selectors_are_refused(label_selector: str | None,
                                         field_selector: str | None) -> None:
    with pytest.raises(selectors.SelectorError):
        selectors.parse(label_selector, field_selector)
