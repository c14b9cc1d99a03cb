"""How the product machines record what went wrong: a typed :class:`Failure`, visible
:class:`Condition` s, and :class:`ActionError` (an ``ActionFailed`` folded into state until
``decide`` reacts to it). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base.events import ActionFailed


@dataclass(frozen=True)
class Failure:
    """Why something failed: a typed ``reason`` (CamelCase) and a human message."""

    reason: str
    message: str


@dataclass(frozen=True)
class Condition:
    """A visible, non-phase fact about a machine (``GarbageCollectionFailed``, ...)."""

    type: str
    reason: str
    message: str
    since: datetime


def set_condition(conditions: tuple[Condition, ...], new: Condition) -> tuple[Condition, ...]:
    """Replace the condition of the same type (keeping its ``since``) or add it."""
    for old in conditions:
        if old.type == new.type:
            kept = Condition(new.type, new.reason, new.message, old.since)
            return tuple(kept if c.type == new.type else c for c in conditions)
    return (*conditions, new)


def clear_condition(conditions: tuple[Condition, ...], type_: str) -> tuple[Condition, ...]:
    return tuple(c for c in conditions if c.type != type_)


@dataclass(frozen=True)
class ActionError:
    """An ``ActionFailed`` event, folded into state until ``decide`` reacts to it."""

    key: str
    action: str
    error_class: str
    message: str
    retryable: bool

    @staticmethod
    def from_event(event: ActionFailed) -> ActionError:
        return ActionError(key=event.key, action=event.action, error_class=event.error_class,
                           message=event.message, retryable=bool(event.retryable))

    def facts(self) -> JsonObject:
        return {"action": self.action, "action_key": self.key, "error_class": self.error_class,
                "error_message": self.message}
