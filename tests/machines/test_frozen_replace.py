"""The machines' fast ``replace`` is ``dataclasses.replace``: same copy, same refusals, and
every dataclass the machine modules define (and so may copy) qualifies for it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from datetime import UTC, datetime

import pytest

import controlplane.machines as machines_package
from controlplane.machines.base.failures import Condition
from controlplane.machines.base.frozen import check_copyable, replace
from controlplane.machines.stages.capture import Capture


def _machine_modules() -> dict[str, object]:
    """Every module under ``controlplane.machines``, folders included, by dotted name."""
    return {info.name: importlib.import_module(info.name)
            for info in pkgutil.walk_packages(machines_package.__path__,
                                              prefix=f"{machines_package.__name__}.")}


def _machine_dataclasses() -> list[type]:
    found: dict[str, type] = {}
    for module in _machine_modules().values():
        for _name, cls in inspect.getmembers(module, inspect.isclass):
            if dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


MODULES_USING_REPLACE = [
    name for name, module in _machine_modules().items()
    if "replace" in vars(module) and not name.endswith(".frozen")
]


def test_every_dataclass_of_a_module_that_copies_states_is_copyable() -> None:
    checked = [cls for cls in _machine_dataclasses()
               if cls.__module__ in MODULES_USING_REPLACE]
    assert len(checked) > 20  # the states, steps and their parts, not an empty sweep
    for cls in checked:
        check_copyable(cls)


def test_no_machine_dataclass_has_a_field_the_json_codec_would_drop() -> None:
    """``codec.encode`` is orjson, which leaves out dataclass fields named with a leading
    underscore: a state holding one would lose it in every projection."""
    classes = _machine_dataclasses()
    assert len(classes) > 20
    hidden = [f"{cls.__qualname__}.{f.name}" for cls in classes
              for f in dataclasses.fields(cls) if f.name.startswith("_")]
    assert hidden == []


def test_replace_gives_what_dataclasses_replace_gives() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    capture = Capture(attempt=2, issued_at=at)
    ours = replace(capture, attempt=3, digest="sha256:" + "a" * 64)
    theirs = dataclasses.replace(capture, attempt=3, digest="sha256:" + "a" * 64)
    assert ours == theirs
    assert vars(ours) == vars(theirs)
    assert capture.attempt == 2  # the original is untouched
    assert type(ours) is Capture


def test_the_copy_is_still_frozen() -> None:
    copy = replace(Condition("Ready", "Fine", "ok", datetime(2026, 1, 1, tzinfo=UTC)),
                   reason="Better")
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.reason = "mutated"  # type: ignore[misc]


def test_an_unknown_field_is_refused_naming_it() -> None:
    with pytest.raises(TypeError, match=r"no field.*colour"):
        replace(Capture(), colour="blue")


def test_classes_replace_cannot_copy_faithfully_are_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            assert self.n >= 0

    @dataclasses.dataclass(frozen=True)
    class Derived:
        n: int
        twice: int = dataclasses.field(init=False, default=0)

    for cls in (Checked, Derived, int):
        with pytest.raises(TypeError):
            check_copyable(cls)
