"""``--class NAME`` from a classes file: the chosen class is embedded, bad files are one
clear error naming the file, the class and the field."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from controlplane.cli.classes import class_for, load_classes
from controlplane.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
DEPLOYED = ROOT / "deploy" / "base" / "controlplane" / "classes.yaml"


def args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"repository": None, "class_name": None, "classes_file": None}
    return argparse.Namespace(**{**base, **kw})


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "classes.yaml"
    path.write_text(text)
    return str(path)


def test_the_classes_deploy_ships_load_and_each_is_selectable() -> None:
    classes = load_classes(str(DEPLOYED))
    assert {"default", "sandbox"} <= set(classes)
    chosen = class_for(args(class_name="sandbox", classes_file=str(DEPLOYED)))
    assert chosen["name"] == "sandbox"
    assert chosen["repository"] == classes["sandbox"].repository


def test_repository_alone_is_the_default_class_with_that_repository() -> None:
    assert class_for(args(repository="localhost:5000/ckpt")) == {
        "repository": "localhost:5000/ckpt"}


def test_repository_overrides_the_class_repository(tmp_path: Path) -> None:
    path = write(tmp_path, "classes:\n- name: gpu\n  repository: r.example/gpu\n"
                 "  restore_attempts: 5\n")
    chosen = class_for(args(class_name="gpu", classes_file=path, repository="other.io/x"))
    assert (chosen["name"], chosen["repository"], chosen["restore_attempts"]) == (
        "gpu", "other.io/x", 5)


@pytest.mark.parametrize(("text", "kw", "fragment"), [
    (None, {}, "--repository REGISTRY/REPO, or --class NAME"),
    (None, {"class_name": "gpu"}, "needs a classes file"),
    ("classes:\n- name: gpu\n", {"class_name": "cpu"}, "no class 'cpu'"),
    ("classes: {}\n", {"class_name": "gpu"}, "must hold `classes:` with a list"),
    ("classes: [\n", {"class_name": "gpu"}, "is not YAML"),
    ("classes:\n- name: gpu\n  on_failure: Explode\n", {"class_name": "gpu"},
     "classes[0].on_failure must be 'Resume' or 'Kill'"),
    ("classes:\n- name: gpu\n  colour: red\n", {"class_name": "gpu"},
     "classes[0] has unknown key(s) colour"),
    ("classes:\n- name: gpu\n- name: gpu\n", {"class_name": "gpu"}, "defined twice"),
])
def test_bad_input_names_what_is_wrong(tmp_path: Path, text: str | None,
                                       kw: dict[str, object], fragment: str) -> None:
    if text is not None:
        kw = {**kw, "classes_file": write(tmp_path, text)}
    with pytest.raises(UsageError) as raised:
        class_for(args(**kw))
    assert fragment in str(raised.value)


def test_a_missing_file_says_which_and_how_to_fix_it(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        class_for(args(class_name="gpu", classes_file=str(tmp_path / "nope.yaml")))
    assert "cannot read the classes file" in str(raised.value)
    assert "--classes-file" in str(raised.value.hint)
