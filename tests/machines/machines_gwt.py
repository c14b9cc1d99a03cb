"""Given/when/then for deciders, plus builders for observations and specs.

    given(MigrationDecider(), spec).decided(obs, T0).when(obs2, T1).then_events("...")

``given`` starts a machine from its spec; ``decided``/``event``/``command`` build history
by running the real decider; ``when``/``when_command`` produce a :class:`Then` whose
assertions chain. Every ``Then`` also checks the contract invariants that must hold for
any decision: ``decide`` is deterministic (also after a JSON round trip of state and
observation), ``load_state(state.to_json()) == state``, and replaying the history from
``initial_state`` reproduces the state.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from controlplane.engine.commands import Command, RecordedCommand
from controlplane.engine.decider import (
    Action,
    Decider,
    Decision,
    Event,
    fold,
)
from controlplane.engine.events import ActionFailed
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
from controlplane.machines.contract import protocol

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NS = "apps"
POD = "web"
SRC_UID = "uid-src"
SRC_NODE = "node-a"
TARGET = "node-b"
OTHER = "node-c"
REPO = "registry.example.com/ckpt"
TEMPLATE: JsonObject = {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "app", "image": "web:1"}]}}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def digest_of(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def pod(name: str = POD, *, uid: str = SRC_UID, node: str | None = SRC_NODE,
        phase: str = "Running", deleting: bool = False,
        annotations: Mapping[str, str] | None = None, namespace: str = NS) -> PodView:
    return PodView(namespace=namespace, name=name, uid=uid, node=node, phase=phase,
                   ready=phase == "Running", deleting=deleting,
                   annotations=dict(annotations or {}))


def manifest(ref: str, digest: str, *, checkpoint_id: str, uid: str = SRC_UID,
             node: str = SRC_NODE) -> TagView:
    return TagView(ref=ref, digest=digest, annotations={
        protocol.MANIFEST_CHECKPOINT_ID: checkpoint_id,
        protocol.MANIFEST_SOURCE_POD_UID: uid, protocol.MANIFEST_NODE: node,
        protocol.MANIFEST_FORMAT: "cri-o-checkpoint/v1",
        protocol.MANIFEST_PROTOCOL: protocol.PROTOCOL_VERSION})


def node(name: str, *, ready: bool = True, cordoned: bool = False) -> NodeView:
    return NodeView(name=name, ready=ready, unschedulable=cordoned)


def error(kind: str = "ServiceUnavailable") -> ProbeError:
    return ProbeError(kind, f"probe failed: {kind}")


def observe(pods: Mapping[str, PodFact] | None = None, tags: Mapping[str, TagFact] | None = None,
            nodes: Mapping[str, NodeFact] | None = None) -> Observation:
    return Observation(pods=dict(pods or {}), tags=dict(tags or {}), nodes=dict(nodes or {}))


def _command(command: Command | str, data: JsonObject) -> Command | RecordedCommand:
    """A typed command, or one by its wire name and data as a recorded one is replayed."""
    if isinstance(command, Command):
        assert not data, "a typed command carries its own data"
        return command
    return RecordedCommand(command, data)


def action_failed(key: str, action: str, *, error_class: str = "Forbidden",
                  message: str = "403 Forbidden", retryable: bool = False) -> Event:
    """An ``ActionFailed`` as the worker records it (every key; ``at`` is ``T0``)."""
    return ActionFailed(at=T0, action=action, key=key, params={}, error_class=error_class,
                        message=message, retryable=retryable, attempts=3).recorded()


def check_contract(decider: Decider[Any], state: Any, obs: Observation, now: datetime,
                   decision: Decision) -> None:
    """The invariants every decision must satisfy, whatever the machine."""
    assert decider.decide(state, obs, now) == decision, "decide is not deterministic"
    again = decider.decide(decider.load_state(state.to_json()),
                           Observation.from_json(obs.to_json()), now)
    assert again == decision, "decide differs after a JSON round trip of its inputs"
    for event in decision.events:
        json.dumps(event.data)
        json.dumps(event.facts)
    for action in decision.actions:
        json.dumps(action.params)
    if decision.needs_tags:
        assert decision.idle, "a decision that needs a tag looked up must not act yet"
        assert not decision.needs_tags & obs.tags.keys(), "it asked for a tag it was given"
    elif decision.idle and not state.terminal:
        assert decision.wake_at is not None, f"phase {state.phase} waits without a deadline"
        assert decision.wake_at > now, "a waiting machine must wake in the future"
    if state.terminal:
        assert decision == Decision(), "a terminal machine decided something"


@dataclass
class Given:
    decider: Decider[Any]
    machine_id: str
    spec: JsonObject
    history: list[Event] = field(default_factory=list)

    @property
    def state(self) -> Any:
        return fold(self.decider, self.decider.initial_state(self.machine_id, self.spec),
                    self.history)

    def decided(self, obs: Observation, now: datetime, *, until_idle: bool = True) -> Given:
        """Run ``decide`` (re-deciding while it acts, as the engine does) and keep events."""
        for _ in range(20):
            decision = self.decider.decide(self.state, obs, now)
            self.history.extend(decision.events)
            if decision.idle or not until_idle:
                return self
        raise AssertionError("decide did not settle on a fixed observation")

    def event(self, *events: Event) -> Given:
        self.history.extend(events)
        return self

    def command(self, command: Command | str, now: datetime, **data: Any) -> Given:
        self.history.extend(self.decider.accept(self.state, _command(command, data), now))
        return self

    def when(self, obs: Observation, now: datetime) -> Then:
        state = self.state
        decision = self.decider.decide(state, obs, now)
        check_contract(self.decider, state, obs, now, decision)
        return Then(self, decision, [*self.history, *decision.events])

    def when_command(self, command: Command | str, now: datetime, **data: Any) -> Then:
        events = tuple(self.decider.accept(self.state, _command(command, data), now))
        return Then(self, Decision(events=events), [*self.history, *events])


@dataclass
class Then:
    given: Given
    decision: Decision
    history: list[Event]

    @property
    def state(self) -> Any:
        g = self.given
        state = fold(g.decider, g.decider.initial_state(g.machine_id, g.spec), self.history)
        assert g.decider.load_state(state.to_json()) == state, "load_state(to_json) differs"
        return state

    @property
    def events(self) -> tuple[Event, ...]:
        return self.decision.events

    @property
    def actions(self) -> tuple[Action, ...]:
        return self.decision.actions

    def event(self, type_: str) -> Event:
        found = [e for e in self.decision.events if e.type == type_]
        assert found, f"no {type_} in {[e.type for e in self.decision.events]}"
        return found[0]

    def action(self, type_: str) -> Action:
        found = [a for a in self.decision.actions if a.type == type_]
        assert found, f"no {type_} in {[a.type for a in self.decision.actions]}"
        return found[0]

    def then_events(self, *types: str) -> Then:
        seen = [e.type for e in self.decision.events]
        assert seen == list(types), f"events {seen}, expected {list(types)}"
        return self

    def then_actions(self, *types: str) -> Then:
        seen = sorted(a.type for a in self.decision.actions)
        assert seen == sorted(types), f"actions {seen}, expected {sorted(types)}"
        return self

    def then_phase(self, phase: str) -> Then:
        assert self.state.phase == phase, f"phase is {self.state.phase}, expected {phase}"
        return self

    def then_idle(self, *, wake_at: datetime | None = None) -> Then:
        assert self.decision.idle, f"expected idle, got {[e.type for e in self.events]}"
        if wake_at is not None:
            assert self.decision.wake_at == wake_at
        return self

    def then_no_action(self, *types: str) -> Then:
        assert not [a for a in self.decision.actions if a.type in types]
        return self

    def and_then(self) -> Given:
        """Continue from the state after this decision."""
        g = self.given
        return Given(g.decider, g.machine_id, g.spec, list(self.history))


# --- a migration's names, shared by the migration modules ---------------------------------

def migration_artifact(mid: str) -> tuple[str, str, str, TagView]:
    """(tag ref, digest, pinned ref, the good manifest) of migration ``mid``'s artifact."""
    digest = digest_of(mid)
    pinned = f"{REPO}@{digest}"
    return f"{REPO}:{NS}.{POD}.{mid}", digest, pinned, manifest(pinned, digest,
                                                                checkpoint_id=mid)


def migration_body(klass: Mapping[str, object], **extra: object) -> dict[str, Any]:
    """A migration spec of ``NS/POD`` from ``SRC_NODE`` to ``TARGET`` (``extra``: more
    spec fields, e.g. ``successor``)."""
    return {"pod": {"namespace": NS, "name": POD, "uid": SRC_UID}, "source_node": SRC_NODE,
            "target_node": TARGET, "template": TEMPLATE, **extra,
            "class": {"repository": REPO, **klass}}


def captured_source(mid: str, **kw: Any) -> PodView:
    """The source as the agent leaves it after migration ``mid``'s capture."""
    ann = {protocol.CAPTURE_CHECKPOINT_ID: mid, protocol.INSTANCE_ID: "inst-src"}
    return pod(annotations=ann, **kw)
