"""The decider contract every machine kind implements, and the engine's value types.

A machine kind is a :class:`Decider`: ``initial_state`` from a spec, ``decide`` from
(state, observation, now) to a :class:`Decision`, and ``evolve`` to fold one event into
the state. Replay is ``fold(evolve, events)``. ``accept`` turns an operator command
(retarget, cancel) into events under the same rules, and ``interests`` says what to
observe. All of it is pure: no I/O, no clock, no ids, no randomness (checked by ruff's
banned-api and import-linter). The store persists what these functions return; the
worker runtime (the shell) observes, calls them and performs the actions. The typed
events and commands built on these envelopes are in :mod:`controlplane.engine.events` and
:mod:`controlplane.engine.commands`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol, TypeVar

from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, Observation


class Cause(StrEnum):
    """Why a decision was made, recorded with it (``events.cause``; the wire values are
    these strings). ``replay --verify`` re-makes the first two; the engine's own records
    (a machine submitted, queued or admitted, an action given up on) and an operator's
    wake have nothing to re-decide."""

    OBSERVATION = "observation"  # decide() on the recorded observation
    COMMAND = "command"  # accept() on the recorded command
    ENGINE = "engine"  # the store, the admitter or the worker appended engine events
    WAKE = "wake"  # an operator made the machine due now (WakeRequested)

    @classmethod
    def _missing_(cls, value: object) -> Cause:
        raise UnknownCause(f"decision cause {value!r} is not one this build knows "
                           f"(known: {', '.join(c.value for c in cls)}); upgrade the "
                           "control plane to read these rows")

    @property
    def redecided(self) -> bool:
        """Whether replay re-makes decisions of this cause."""
        return self in (Cause.OBSERVATION, Cause.COMMAND)


class UnknownCause(ValueError):
    """A recorded decision cause this build does not know."""


@dataclass(frozen=True)
class Event:
    """A fact that happened to a machine. ``type`` is past tense (``CaptureRequested``).

    ``facts`` are the observation facts that justified it (pod uid/phase/node, tag digest,
    error class), so history answers *why*.
    """

    type: str
    data: JsonObject = field(default_factory=dict)
    facts: JsonObject = field(default_factory=dict)


class EventLike(Protocol):
    """What ``evolve`` reads of an event: its type and data, never its ``facts`` (those
    say *why*, for history). An :class:`Event` is one; so is replay's lighter row
    (``store.replay_reads.FoldEvent``), which a rebuild folds a million of without
    building an ``Event`` for each."""

    @property
    def type(self) -> str: ...

    @property
    def data(self) -> JsonObject: ...


@dataclass(frozen=True)
class Action:
    """A side effect the worker performs after the commit, idempotently.

    ``key`` is the idempotency key (deterministic: derived from the machine id and the
    step), so performing the same action twice is harmless.
    """

    type: str
    key: str
    params: JsonObject = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """What ``decide`` returns: new events, actions to run after commit, next wake.

    Engine rule: when a decision appends events or runs actions, the machine is decided
    again at once (the world likely changed); otherwise it sleeps until ``wake_at`` or an
    external wake (a pod watch event on one of its wake keys). A waiting phase must set
    ``wake_at`` to its deadline (hang guard).

    ``needs_tags``: registry tags this decision cannot be made without. A machine's
    interests name what it watches on every wake (pods, from the watch cache: free); a
    tag costs a registry request, so a machine asks for it only at the moment a decision
    rests on it. The worker then observes those tags and decides again, on the same
    ``now``; only that second decision (and the observation with the tags) is recorded,
    so replaying it needs nothing more.

    ``confirm``: the decision gives up on something (a step fails) on what the pods and
    nodes looked like. A watch cache can lag the server, so before it is taken the
    worker reads them through once and decides again on the server's answer (as it does
    for any decision that would end the machine).
    """

    events: tuple[Event, ...] = ()
    actions: tuple[Action, ...] = ()
    wake_at: datetime | None = None
    needs_tags: frozenset[str] = frozenset()
    confirm: bool = False

    @property
    def idle(self) -> bool:
        return not self.events and not self.actions


class CommandLike(Protocol):
    """What ``accept`` is given: a command's wire name and data. A typed command
    (:mod:`controlplane.engine.commands`) is one; so is a recorded one replayed
    (``RecordedCommand``). A kind decodes it once with its ``CommandSet``."""

    @property
    def type(self) -> str: ...

    @property
    def data(self) -> JsonObject: ...


class CommandRejected(Exception):
    """``accept`` refuses a command; the message says why and what to do instead."""


class InvalidSpec(ValueError):
    """A spec failed validation; the message names the field and the fix."""


class MachineState(Protocol):
    """What the engine needs to know about any machine's state."""

    @property
    def phase(self) -> str: ...

    @property
    def terminal(self) -> bool: ...

    @property
    def wake_keys(self) -> frozenset[str]:
        """Keys (e.g. pod UIDs) whose external change should wake this machine."""
        ...

    def to_json(self) -> JsonObject: ...


S = TypeVar("S", bound=MachineState)


class Decider(Protocol[S]):
    """One machine kind. Every method is pure and deterministic."""

    @property
    def kind(self) -> str: ...

    def validate_spec(self, spec: JsonObject) -> JsonObject:
        """Return the normalised spec or raise :class:`InvalidSpec` naming the field."""
        ...

    def initial_state(self, machine_id: str, spec: JsonObject) -> S: ...

    def interests(self, state: S) -> Interests: ...

    def decide(self, state: S, observation: Observation, now: datetime) -> Decision: ...

    def evolve(self, state: S, event: EventLike) -> S: ...

    def accept(self, state: S, command: CommandLike, now: datetime) -> Sequence[Event]:
        """Events for an operator command, or raise :class:`CommandRejected`."""
        ...

    def load_state(self, data: JsonObject) -> S:
        """Inverse of ``state.to_json()``."""
        ...


def fold(decider: Decider[S], state: S, events: Iterable[EventLike]) -> S:
    """Apply ``evolve`` over ``events``: replay in one line."""
    for event in events:
        state = decider.evolve(state, event)
    return state
