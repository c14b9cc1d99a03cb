"""How an operation is read: from its state alone, what it waits for, how it ended and
why, the pod it left running and the checkpoint it made. Every kind's ``view.py``
implements :class:`View`; the CLI's ``--wait`` line, the HTTP API, the front door's
resource status and the reports read operations through it. Pure.

Success is one definition everywhere (:attr:`View.success`): a rolled-back migration,
one whose artifact could not be deleted and every cancelled operation count as failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base.codec import decode
from controlplane.machines.base.failures import Failure

CANCELLED = "Cancelled"
BY_OPERATOR = "cancelled by the operator"

#: What the stages several kinds compose wait for, said once (each kind maps its phases).
CAPTURE_REQUESTED = "the node agent to capture and push the checkpoint"
CHECKPOINTING = ("the node agent to capture and push the checkpoint, and the registry to "
                 "show it")
CAPTURED = "the registry to show the pushed checkpoint"
RELEASING = "the workload to be released after the capture"
DELETING_SOURCE = "the source pod to be gone"
RESTORING = "the restored pod to be scheduled, restored by the node agent and Ready"
UNSTICKING = "the source pod to resume after a failed capture"
WAKING_IN_PLACE = "the source pod to resume where it is"
COLLECTING_GARBAGE = "the checkpoint artifact to be deleted from the registry"


@dataclass(frozen=True)
class Outcome:
    """How a terminal operation ended: the reason (CamelCase, as the machine recorded
    it) and a message."""

    succeeded: bool
    reason: str
    message: str


class View(Protocol):
    """One kind's reading of its own state (its ``view.py``)."""

    #: The terminal phases that count as success.
    success: frozenset[str]
    #: What each non-terminal phase waits for, in one sentence.
    waiting: Mapping[str, str]

    def outcome(self, state: JsonObject, phase: str) -> Outcome:
        """How a terminal operation in ``phase`` ended."""
        ...

    def final_pod(self, state: JsonObject, phase: str) -> str | None:
        """``namespace/name`` of the pod it left running (``None``: none, or not yet)."""
        ...

    def checkpoint(self, state: JsonObject) -> dict[str, str] | None:
        """``{artifact, digest?}`` of the checkpoint it makes (``None``: it makes none)."""
        ...


class KindView:
    """A view by its kind's state class: a terminal phase in :attr:`success` says
    :meth:`succeeded`, ``Cancelled`` says :meth:`cancelled`, any other the failure the
    state keeps. It restores no pod and makes no checkpoint unless a subclass says so."""

    state_class: type[Any]
    success: frozenset[str]
    waiting: Mapping[str, str]

    def __init_subclass__(cls, *, state: type[Any] | None = None,
                          success: frozenset[str] = frozenset(), **kwargs: Any) -> None:
        """``class XView(KindView, state=XState, success=frozenset({...}))``."""
        super().__init_subclass__(**kwargs)
        if state is not None:
            cls.state_class = state
        if success:
            cls.success = success

    def decoded(self, state: JsonObject) -> Any:
        return decode(self.state_class, state)

    def outcome(self, state: JsonObject, phase: str) -> Outcome:
        s = self.decoded(state)
        if phase in self.success:
            said = self.succeeded(s)
        elif phase == CANCELLED:
            said = self.cancelled(s)
        else:
            said = failed(getattr(s, "failure", None), phase)
        return Outcome(phase in self.success, said[0] or phase, said[1])

    def succeeded(self, s: Any) -> tuple[str, str]:
        """The reason and message of a success."""
        return "Succeeded", ""

    def cancelled(self, s: Any) -> tuple[str, str]:
        """The reason and message of a cancel."""
        return cancelled(getattr(s, "failure", None))

    def final_pod(self, state: JsonObject, phase: str) -> str | None:
        return None

    def checkpoint(self, state: JsonObject) -> dict[str, str] | None:
        return None


class CapturingView(KindView):
    """A kind that captures: its checkpoint is its spec's artifact, with the digest once
    the registry showed it."""

    def checkpoint(self, state: JsonObject) -> dict[str, str] | None:
        s = self.decoded(state)
        return checkpoint_made(s.spec.artifact, s.capture.digest)


class RestoringView(KindView):
    """A kind that restores: once it succeeded, its pod is the last restore attempt's."""

    def final_pod(self, state: JsonObject, phase: str) -> str | None:
        s = self.decoded(state)
        return s.restore.plan.key if phase in self.success and s.restore else None


def failed(failure: Failure | None, phase: str) -> tuple[str, str]:
    """A failure's reason and message, as the machine kept it (else the phase)."""
    return (failure.reason, failure.message) if failure else (phase, "")


def cancelled(failure: Failure | None, default: str = BY_OPERATOR) -> tuple[str, str]:
    """A cancel's reason is ``Cancelled`` even when the machine ended on another one (a
    restore's attempt abandoned, say): the message keeps what happened."""
    return CANCELLED, failure.message if failure and failure.message else default


def checkpoint_made(artifact: str, digest: str | None) -> dict[str, str]:
    """A capture's checkpoint: the tag from the start, the digest once verified."""
    out = {"artifact": artifact}
    if digest:
        out["digest"] = digest
    return out
