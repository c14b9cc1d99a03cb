"""The state codec refuses what it does not know instead of dropping it.

A state a newer release wrote may carry a field or an enum value this release lacks;
decoding it with the key dropped would be a guess (and the next commit would erase the
field). ``decode`` raises instead, at any depth, and a state it wrote itself always
decodes (the golden and machine suites pin the latter for every kind).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import pytest

from controlplane.engine.codec import UnknownField, decode, encode_object


class Colour(StrEnum):
    RED = "Red"


@dataclass(frozen=True)
class Inner:
    colour: Colour
    note: str = ""


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner
    items: tuple[Inner, ...] = ()
    maybe: Inner | None = None


GOOD = encode_object(Outer("a", Inner(Colour.RED), (Inner(Colour.RED, "x"),)))


def test_a_state_this_release_wrote_decodes_to_itself() -> None:
    assert decode(Outer, GOOD) == Outer("a", Inner(Colour.RED), (Inner(Colour.RED, "x"),))


def test_a_top_level_key_no_field_declares_is_refused() -> None:
    with pytest.raises(UnknownField, match="added"):
        decode(Outer, {**GOOD, "added": 1})


def test_a_nested_key_no_field_declares_is_refused() -> None:
    with pytest.raises(UnknownField, match="depth"):
        decode(Outer, {**GOOD, "inner": {"colour": "Red", "depth": 2}})
    with pytest.raises(UnknownField):
        decode(Outer, {**GOOD, "items": [{"colour": "Red", "depth": 2}]})


def test_an_unknown_key_inside_an_optional_member_is_refused_not_read_as_absent() -> None:
    with pytest.raises(ValueError, match="depth"):
        decode(Outer, {**GOOD, "maybe": {"colour": "Red", "depth": 2}})


def test_an_enum_value_this_release_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="Green"):
        decode(Outer, {**GOOD, "inner": {"colour": "Green"}})
