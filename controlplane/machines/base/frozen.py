"""``replace`` for the machines' frozen dataclass states, without ``dataclasses.replace``'s cost.

``evolve`` copies a state with a field or two changed on every event, so the copy is the
fold's inner loop: ``dataclasses.replace`` re-reads every field's metadata and runs the
frozen ``__init__`` (one ``object.__setattr__`` per field) each time, which was half of a
replay's fold. This ``replace`` copies the instance dict and applies the changes, after
checking that every changed name is a field (as ``dataclasses.replace`` does).

The copy skips ``__init__``, so it must only be used on dataclasses without
``__post_init__`` and without ``init=False`` fields; :func:`check_copyable` says whether a
class qualifies (a test runs it on every machine state class). For mypy this *is*
``dataclasses.replace``, so its plugin still checks every call's field names and types.
Pure; used by the machine modules.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

T = TypeVar("T")


_FIELD_NAMES: dict[type, frozenset[str]] = {}


def _field_names(cls: Any) -> frozenset[str]:
    names = _FIELD_NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return names


def check_copyable(cls: type) -> None:
    """Raise ``TypeError`` unless copying ``cls``'s instance dict is a faithful replace."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has __post_init__: use dataclasses.replace")
    if hasattr(cls, "__slots__"):
        raise TypeError(f"{cls.__name__} uses __slots__: it has no instance dict to copy")
    if any(not f.init for f in dataclasses.fields(cls)):
        raise TypeError(f"{cls.__name__} has init=False fields: use dataclasses.replace")


def _replace(obj: T, /, **changes: Any) -> T:
    cls: Any = type(obj)
    # A dict lookup and a subset test: no set is built on the fold's hot path.
    names = _FIELD_NAMES.get(cls) or _field_names(cls)
    if not names.issuperset(changes):
        unknown = sorted(changes.keys() - names)
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(unknown)}")
    copy: T = object.__new__(cls)
    values = copy.__dict__
    values.update(obj.__dict__)
    values.update(changes)
    return copy


if TYPE_CHECKING:
    from dataclasses import replace as replace
else:
    replace = _replace

__all__ = ["check_copyable", "replace"]
