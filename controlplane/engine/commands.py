"""Typed commands: one frozen dataclass per command an operator (or the engine, on a
machine's behalf) sends a running machine, and the set of them a kind accepts.

A command is recorded as the decision input ``{"type": ..., "data": {...}}``, exactly as
before commands were typed, so recorded commands replay. :class:`Command` is the base:
its wire name is the class name (or ``name=``), its ``data`` the fields, encoded as an
event's are (:mod:`controlplane.engine.events`). ``cpctl replay --verify`` hands the
recorded one back as a :class:`RecordedCommand`; a kind's ``accept`` decodes either once
with its :class:`CommandSet` and dispatches on the class. A command type the kind does not
accept, or data its class does not declare, is refused (:class:`CommandRejected`). Pure.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from controlplane.engine.decider import CommandLike, CommandRejected
from controlplane.engine.events import Undecodable, decode_fields, encode_fields
from controlplane.engine.jsonvalue import JsonObject

C = TypeVar("C", bound="Command")


class Command:
    """Base of the typed commands. Subclasses are frozen dataclasses."""

    NAME: ClassVar[str]

    def __init_subclass__(cls, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.NAME = name or cls.__name__

    @property
    def type(self) -> str:
        """The wire name."""
        return self.NAME

    @property
    def data(self) -> JsonObject:
        """The command's data as recorded."""
        return encode_fields(self)

    @classmethod
    def from_data(cls: builtins.type[C], data: JsonObject) -> C:  # .type: the wire name
        """The command ``data`` records, or :class:`CommandRejected` if it does not fit."""
        try:
            typed_command: C = decode_fields(cls, data)
        except Undecodable as err:
            raise CommandRejected(f"command {cls.NAME!r} {err}") from None
        return typed_command


@dataclass(frozen=True)
class RecordedCommand:
    """A command as recorded in a decision's input, given back to ``accept`` by replay."""

    type: str
    data: JsonObject = field(default_factory=dict)


def command_input(command: CommandLike) -> JsonObject:
    """The decision input recorded for ``command``."""
    return {"command": {"type": command.type, "data": command.data}}


class CommandSet:
    """The commands one kind accepts, by wire name."""

    def __init__(self, kind: str, *commands: type[Command]) -> None:
        self.kind = kind
        self._by_name = {cls.NAME: cls for cls in commands}

    def decode(self, command: CommandLike) -> Command:
        """The typed command (a typed one of this set passes through), or
        :class:`CommandRejected` naming what the kind accepts."""
        cls = self._by_name.get(command.type)
        if cls is None:
            names = sorted(self._by_name)
            known = f"only {names[0]}" if len(names) == 1 else " and ".join(names)
            raise CommandRejected(f"{self.kind} machines accept {known}, not "
                                  f"{command.type!r}")
        if isinstance(command, cls):
            return command
        return cls.from_data(command.data)
