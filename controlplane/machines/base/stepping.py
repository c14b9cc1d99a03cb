"""What a sub-step decides, and how a kind starts and ends.

:class:`Step`: what one stage (capture, restore, source operation) decided, merged by the
owning machine into one :class:`~controlplane.engine.decider.Decision`; :func:`started`
is every product kind's first decision and :func:`finish` its last. Action keys are
deterministic: ``machine_id/step/.../attempt`` (:func:`action_key`). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from controlplane.engine.decider import Action, Decision, Event
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import (
    Observation,
)
from controlplane.machines.base.events import Started
from controlplane.machines.base.facts import with_facts
from controlplane.machines.base.timing import earliest
from controlplane.machines.contract.actions import EventType, emit_event


def action_key(machine_id: str, *parts: str | int) -> str:
    """A deterministic idempotency key: ``machine_id/part/part...``."""
    return "/".join([machine_id, *(str(p) for p in parts)])


@dataclass(frozen=True)
class Step:
    """What one sub-step decided: events, actions and when to look again, or the registry
    tags it must see before it can decide (``needs_tags``)."""

    events: tuple[Event, ...] = ()
    actions: tuple[Action, ...] = ()
    wake_at: datetime | None = None
    needs_tags: frozenset[str] = frozenset()
    confirm: bool = False  # a failure: taken only on a fresh read (``Decision.confirm``)

    @property
    def idle(self) -> bool:
        return not self.events and not self.actions

    def decision(self) -> Decision:
        return Decision(self.events, self.actions, None if not self.idle else self.wake_at,
                        self.needs_tags, self.confirm)


def failing(*events: Event, actions: Iterable[Action] = ()) -> Step:
    """A step that fails on what it observed: confirmed on a fresh read before it is taken."""
    return Step(events=tuple(events), actions=tuple(actions), confirm=True)


def need(*tags: str) -> Step:
    """No decision yet: look these registry tags up first (see ``Decision.needs_tags``)."""
    return Step(needs_tags=frozenset(tags))


def wait(*moments: datetime | None) -> Step:
    """An idle step that wakes at the earliest of ``moments``."""
    return Step(wake_at=earliest(*moments))


def emit(*events: Event, actions: Iterable[Action] = ()) -> Step:
    return Step(events=tuple(events), actions=tuple(actions))


class _Deciding(Protocol):
    def decide(self, state: Any, observation: Observation, now: datetime) -> Decision: ...

    def evolve(self, state: Any, event: Any) -> Any: ...


def started(decider: _Deciding, state: Any, opening: Started, observation: Observation,
            now: datetime, *, facts: JsonObject | None = None,
            actions: Iterable[Action] = ()) -> Decision:
    """A product kind's first decision: ``Started`` (with ``actions`` before the rest),
    folded, then what the kind decides right after it on the same observation."""
    rest = decider.decide(decider.evolve(state, opening), observation, now)
    both = Decision((opening.recorded(facts), *rest.events), (*actions, *rest.actions),
                    rest.wake_at, confirm=rest.confirm)  # tags it needs: asked for next
    return with_facts(both, observation)


def finish(ending: Event, *, machine_id: str, namespace: str, pod_name: str,
           pod_uid: str | None, reason: str, message: str, warning: bool) -> Step:
    """A kind's terminal event, and a Kubernetes Event on the pod saying how it ended."""
    notice = emit_event(action_key(machine_id, "event", "finished"), namespace=namespace,
                        pod_name=pod_name, pod_uid=pod_uid,
                        type_=EventType.WARNING if warning else EventType.NORMAL,
                        reason=reason, message=message)
    return emit(ending, actions=[notice])
