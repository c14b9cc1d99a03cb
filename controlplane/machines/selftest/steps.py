"""The ``steps`` machine: walks N steps, one event and one action per step.

It is the engine's own test and benchmark workload (the benchmark's "7 phases, 6
transitions" is ``steps=6``), and a minimal example of the decider contract. Options:

- ``payload_bytes``: size of each ``StepCompleted`` payload (benchmarks use ~200 B);
- ``gate_pod`` / ``gate_pod_uid``: before the first step, wait until that pod is observed
  Running with that UID; the UID is a wake key, so a pod watch event wakes the machine;
- ``deadline_seconds``: give up waiting for the gate after this long (hang guard);
- ``fail_on_action_error``: an ``ActionFailed`` event fails the machine (else it retries
  the step's action, as a level-triggered decider does).

Pure: no I/O, clock or randomness (see ``controlplane.engine.decider``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar

from controlplane.engine.commands import CommandSet
from controlplane.engine.decider import (
    Action,
    CommandLike,
    CommandRejected,
    Decision,
    Event,
    EventLike,
    InvalidSpec,
)
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, Observation, PodView, ProbeError
from controlplane.machines.base.commands import Cancel
from controlplane.machines.base.events import (
    ActionFailed,
    Admitted,
    DomainEvent,
    Queued,
    UnknownEvent,
    WakeRequested,
)
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.states import PhasedState
from controlplane.machines.selftest.events import (
    STEPS_EVENTS,
    Cancelled,
    GateArmed,
    GateOpened,
    GateTimedOut,
    StepCompleted,
)

KIND = "steps"
MAX_STEPS = 1000
MAX_PAYLOAD = 64 * 1024

WORK_ACTION = "steps.work"


class StepsPhase(StrEnum):
    WAITING = "Waiting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL = frozenset({StepsPhase.SUCCEEDED, StepsPhase.FAILED, StepsPhase.CANCELLED})


@dataclass(frozen=True)
class StepsState(PhasedState):
    TERMINAL_PHASES: ClassVar[frozenset[Any]] = TERMINAL

    machine_id: str
    steps: int
    done: int
    status: StepsPhase
    payload_bytes: int
    gate_pod: str | None
    gate_pod_uid: str | None
    deadline_seconds: int
    deadline: str | None  # ISO time; the gate's hang guard, armed when waiting starts
    fail_on_action_error: bool
    reason: str = ""


    @property
    def wake_keys(self) -> frozenset[str]:
        if self.status is StepsPhase.WAITING and self.gate_pod_uid:
            return frozenset({self.gate_pod_uid})
        return frozenset()

    def to_json(self) -> JsonObject:
        return {
            "machine_id": self.machine_id, "steps": self.steps, "done": self.done,
            "status": self.status.value, "payload_bytes": self.payload_bytes,
            "gate_pod": self.gate_pod, "gate_pod_uid": self.gate_pod_uid,
            "deadline_seconds": self.deadline_seconds, "deadline": self.deadline,
            "fail_on_action_error": self.fail_on_action_error,
            "reason": self.reason,
        }


def _int_field(spec: JsonObject, name: str, default: int, low: int, high: int) -> int:
    value = spec.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(f"spec.{name} must be an integer from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise InvalidSpec(f"spec.{name} must be from {low} to {high}, got {value}")
    return value


#: The commands a steps machine accepts.
_COMMANDS = CommandSet("steps", Cancel)


class StepsDecider:
    """The ``steps`` kind."""

    kind = KIND

    def validate_spec(self, spec: JsonObject) -> JsonObject:
        known = {"steps", "payload_bytes", "gate_pod", "gate_pod_uid", "deadline_seconds",
                 "fail_on_action_error"}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise InvalidSpec(
                f"spec has unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        out: JsonObject = {
            "steps": _int_field(spec, "steps", 6, 1, MAX_STEPS),
            "payload_bytes": _int_field(spec, "payload_bytes", 0, 0, MAX_PAYLOAD),
            "deadline_seconds": _int_field(spec, "deadline_seconds", 3600, 1, 7 * 86400),
            "fail_on_action_error": bool(spec.get("fail_on_action_error", True)),
        }
        gate, uid = spec.get("gate_pod"), spec.get("gate_pod_uid")
        if (gate is None) != (uid is None):
            raise InvalidSpec("spec.gate_pod and spec.gate_pod_uid must be given together")
        if gate is not None:
            if not isinstance(gate, str) or gate.count("/") != 1 or "" in gate.split("/"):
                raise InvalidSpec(f"spec.gate_pod must be 'namespace/name', got {gate!r}")
            if not isinstance(uid, str) or not uid:
                raise InvalidSpec("spec.gate_pod_uid must be a non-empty string")
            out["gate_pod"], out["gate_pod_uid"] = gate, uid
        return out

    def initial_state(self, machine_id: str, spec: JsonObject) -> StepsState:
        gate = spec.get("gate_pod")
        uid = spec.get("gate_pod_uid")
        steps = spec.get("steps", 6)
        payload = spec.get("payload_bytes", 0)
        deadline_seconds = spec.get("deadline_seconds", 3600)
        assert isinstance(steps, int)
        assert isinstance(payload, int)
        assert isinstance(deadline_seconds, int)
        return StepsState(
            machine_id=machine_id, steps=steps, done=0,
            status=StepsPhase.WAITING if gate else StepsPhase.RUNNING,
            payload_bytes=payload, gate_pod=gate if isinstance(gate, str) else None,
            gate_pod_uid=uid if isinstance(uid, str) else None,
            deadline_seconds=deadline_seconds, deadline=None,
            fail_on_action_error=bool(spec.get("fail_on_action_error", True)),
        )

    def interests(self, state: StepsState) -> Interests:
        if state.status is StepsPhase.WAITING and state.gate_pod:
            return Interests(pods=frozenset({state.gate_pod}))
        return Interests()

    def decide(self, state: StepsState, observation: Observation, now: datetime) -> Decision:
        if state.terminal:
            return Decision()
        if state.status is StepsPhase.WAITING:
            return self._decide_gate(state, observation, now)
        step = state.done + 1
        event = StepCompleted(step=step, payload="x" * state.payload_bytes).recorded()
        action = Action(WORK_ACTION, f"{state.machine_id}:step:{step}", {"step": step})
        return Decision(events=(event,), actions=(action,))

    def _decide_gate(self, state: StepsState, observation: Observation, now: datetime) -> Decision:
        assert state.gate_pod is not None
        if state.deadline is None:
            # Arm the hang guard first, so the deadline is part of the history.
            deadline = now + timedelta(seconds=state.deadline_seconds)
            return Decision(events=(GateArmed(deadline=deadline).recorded(),))
        pod = observation.pods.get(state.gate_pod)
        deadline = datetime.fromisoformat(state.deadline)
        if isinstance(pod, PodView) and pod.uid == state.gate_pod_uid and pod.phase == "Running":
            return Decision(events=(GateOpened().recorded({"pod_uid": pod.uid,
                                                            "pod_phase": pod.phase}),))
        if now >= deadline:
            facts: JsonObject = {"deadline": state.deadline}
            if isinstance(pod, ProbeError):
                facts["error_class"] = pod.error_class
            return Decision(events=(GateTimedOut(reason="gate pod never ran").recorded(facts),))
        return Decision(wake_at=deadline)

    def evolve(self, state: StepsState, recorded: EventLike | DomainEvent) -> StepsState:
        """Fold one event; an event this kind does not record raises ``UnknownEvent``."""
        event = STEPS_EVENTS.decode(recorded)
        match event:
            case StepCompleted():
                done = state.done + 1
                status = StepsPhase.SUCCEEDED if done >= state.steps else StepsPhase.RUNNING
                return replace(state, done=done, status=status)
            case GateArmed(deadline=deadline):
                return replace(state, deadline=deadline.isoformat())
            case GateOpened():
                return replace(state, status=StepsPhase.RUNNING)
            case GateTimedOut(reason=reason):
                return replace(state, status=StepsPhase.FAILED, reason=reason)
            case Cancelled():
                return replace(state, status=StepsPhase.CANCELLED,
                               reason="cancelled by operator")
            case ActionFailed(key=key, message=message):
                if state.fail_on_action_error and not state.terminal:
                    return replace(state, status=StepsPhase.FAILED,
                                   reason=f"action {key} failed: {message}")
                return state
            case Queued() | Admitted() | WakeRequested():
                return state
        raise UnknownEvent(f"event {event.NAME!r} is in STEPS_EVENTS but the steps kind does "
                           "not fold it")

    def accept(self, state: StepsState, command: CommandLike,
               now: datetime) -> Sequence[Event]:
        _COMMANDS.decode(command)  # Cancel: the only one
        if state.terminal:
            raise CommandRejected(f"machine {state.machine_id} is already {state.phase}")
        return (Cancelled(at_step=state.done).recorded(),)

    def load_state(self, data: JsonObject) -> StepsState:
        def opt(key: str) -> str | None:
            v = data.get(key)
            return None if v is None else str(v)

        steps, done, payload = data["steps"], data["done"], data["payload_bytes"]
        deadline_seconds = data["deadline_seconds"]
        assert isinstance(steps, int)
        assert isinstance(done, int)
        assert isinstance(payload, int)
        assert isinstance(deadline_seconds, int)
        return StepsState(
            machine_id=str(data["machine_id"]), steps=steps, done=done,
            status=StepsPhase(str(data["status"])), payload_bytes=payload,
            gate_pod=opt("gate_pod"), gate_pod_uid=opt("gate_pod_uid"),
            deadline_seconds=deadline_seconds, deadline=opt("deadline"),
            fail_on_action_error=bool(data["fail_on_action_error"]),
            reason=str(data.get("reason", "")),
        )
