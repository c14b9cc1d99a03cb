"""Small shared pieces of the product machines: time, facts, failures, step results.

- Time: events carry the decision time as ``data["at"]`` (ISO text) because ``evolve``
  has no clock; deadlines are computed from it. Registries have no watch, so waiting on a
  tag polls on a deterministic backoff schedule (:func:`next_poll`).
- Facts: every event carries the observation facts that justified it
  (:func:`pod_facts`, :func:`tag_facts`, :func:`node_facts`).
- :class:`Step`: what a sub-step (capture, restore, source operation) decided, merged by
  the owning machine into one :class:`~controlplane.engine.decider.Decision`.
- Action keys are deterministic: ``machine_id/step/.../attempt`` (:func:`action_key`).

Used by the capture, restore, source and machine modules. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from controlplane.engine.decider import Action, Decision, Event
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import (
    NodeFact,
    NodeView,
    Observation,
    PodFact,
    PodView,
    ProbeError,
    TagFact,
    TagView,
)
from controlplane.machines.base.events import ActionFailed, Started
from controlplane.machines.contract.actions import EventType, emit_event

#: An action whose effect is not observed this long after it was issued is issued again
#: (with a new key): this heals a crash between the commit and the action.
REISSUE_AFTER = timedelta(seconds=30)

#: First and longest interval between registry probes while waiting on a tag.
POLL_FIRST = timedelta(seconds=2)
POLL_MAX = timedelta(seconds=30)

#: A request whose action failed with a *retryable* error (the worker's own retries of a
#: 429/5xx/409 ran out) is issued again by its decider, after ``reissue_backoff``, up to
#: this many attempts in all; a refusal (403, 422...) or the last attempt's failure ends
#: the step as before.
REQUEST_ATTEMPTS = 4

#: Every product machine's first decision records when it started (its hang guards
#: count from there), with the observation it started on.






def seconds(n: int) -> timedelta:
    return timedelta(seconds=n)


def earliest(*moments: datetime | None) -> datetime | None:
    """The earliest of the given times, ignoring ``None``."""
    present = [m for m in moments if m is not None]
    return min(present) if present else None


def next_poll(since: datetime, now: datetime) -> datetime:
    """Next registry probe time: 2 s, 4 s, 8 s ... after ``since``, then every 30 s.

    A pure function of (``since``, ``now``), so no event is needed per probe.
    """
    step, moment = POLL_FIRST, since + POLL_FIRST
    while moment <= now:
        step = min(step * 2, POLL_MAX)
        moment += step
    return moment


def may_reissue(error: ActionError, attempt: int) -> bool:
    """Whether a request whose ``attempt`` failed with ``error`` is issued again."""
    return error.retryable and attempt < REQUEST_ATTEMPTS


def reissue_backoff(attempt: int) -> timedelta:
    """How long after a failed ``attempt`` was issued its retry is: 2 s, 4 s, 8 s..."""
    return backoff(attempt, base=POLL_FIRST, cap=POLL_MAX)


def backoff(attempt: int, *, base: timedelta, cap: timedelta) -> timedelta:
    """Exponential backoff for retry ``attempt`` (1-based), capped."""
    grown: timedelta = base * (2 ** min(max(attempt - 1, 0), 30))
    return min(grown, cap)


def action_key(machine_id: str, *parts: str | int) -> str:
    """A deterministic idempotency key: ``machine_id/part/part...``."""
    return "/".join([machine_id, *(str(p) for p in parts)])


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


def pod_facts(key: str, fact: PodFact) -> JsonObject:
    """The facts of one observed pod, for ``Event.facts``."""
    if isinstance(fact, ProbeError):
        return {"pod": key, "pod_error_class": fact.error_class, "pod_error": fact.message}
    if fact is None:
        return {"pod": key, "pod_present": False}
    return {"pod": key, "pod_present": True, "pod_uid": fact.uid, "pod_phase": fact.phase,
            "pod_node": fact.node, "pod_deleting": fact.deleting}


def tag_facts(ref: str, fact: TagFact) -> JsonObject:
    """The facts of one observed registry reference, for ``Event.facts``."""
    if isinstance(fact, ProbeError):
        return {"tag": ref, "tag_error_class": fact.error_class, "tag_error": fact.message}
    if fact is None:
        return {"tag": ref, "tag_present": False}
    return {"tag": ref, "tag_present": True, "tag_digest": fact.digest,
            "tag_annotations": dict(fact.annotations)}


def node_facts(name: str, fact: NodeFact) -> JsonObject:
    """The facts of one observed node, for ``Event.facts``."""
    if isinstance(fact, ProbeError):
        return {"node": name, "node_error_class": fact.error_class}
    if fact is None:
        return {"node": name, "node_present": False}
    return {"node": name, "node_present": True, "node_ready": fact.ready,
            "node_unschedulable": fact.unschedulable}


def merge_facts(*parts: JsonObject) -> JsonObject:
    out: JsonObject = {}
    for part in parts:
        out.update(part)
    return out


def is_running_pod(fact: PodFact, uid: str) -> bool:
    """The pod is observed, is the one with ``uid``, and is not going away."""
    return isinstance(fact, PodView) and fact.uid == uid and not fact.deleting


def tag_or_none(fact: TagFact) -> TagView | None:
    return fact if isinstance(fact, TagView) else None


def node_problem(fact: NodeFact) -> str | None:
    """Why a node cannot take a pod now (missing, NotReady, cordoned), or ``None``."""
    if isinstance(fact, ProbeError):
        return None
    if fact is None:
        return "node does not exist"
    if not isinstance(fact, NodeView):
        return None
    if fact.unschedulable:
        return "node is cordoned (unschedulable)"
    if not fact.ready:
        return "node is NotReady"
    return None


def observation_facts(obs: Observation) -> JsonObject:
    """Everything a decision was taken on, as facts (for events that name nothing finer)."""
    out: JsonObject = {}
    for key, pod in sorted(obs.pods.items()):
        out[f"pod {key}"] = pod_facts(key, pod)
    for ref, tag in sorted(obs.tags.items()):
        out[f"tag {ref}"] = tag_facts(ref, tag)
    for name, node in sorted(obs.nodes.items()):
        out[f"node {name}"] = node_facts(name, node)
    return out


def with_facts(decision: Decision, obs: Observation) -> Decision:
    """Give every event without facts the facts of the observation it was decided on."""
    if not decision.events or all(e.facts for e in decision.events):
        return decision
    summary = observation_facts(obs)
    events = tuple(e if e.facts else Event(e.type, e.data, dict(summary))
                   for e in decision.events)
    return Decision(events, decision.actions, decision.wake_at, decision.needs_tags,
                    decision.confirm)


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
