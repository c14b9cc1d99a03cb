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
from typing import Protocol

from controlplane.engine.jsonvalue import JsonObject
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


class NoPodNoCheckpoint:
    """The parts of a view for kinds that restore nothing and capture nothing."""

    def final_pod(self, state: JsonObject, phase: str) -> str | None:
        return None

    def checkpoint(self, state: JsonObject) -> dict[str, str] | None:
        return None


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


def outcome_of(view: View, state: JsonObject, phase: str,
               said: tuple[str, str]) -> Outcome:
    reason, message = said
    return Outcome(phase in view.success, reason or phase, message)
