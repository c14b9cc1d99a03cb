"""A suspension read from its state: it succeeded when the workload is ``Suspended`` with a
verified checkpoint to resume from. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base import views
from controlplane.machines.base.codec import decode
from controlplane.machines.base.views import Outcome
from controlplane.machines.suspend.machine import SuspendPhase, SuspendState


class SuspendView(views.NoPodNoCheckpoint):
    success: frozenset[str] = frozenset({SuspendPhase.SUSPENDED})
    waiting: Mapping[str, str] = {
        SuspendPhase.CHECKPOINTING: views.CHECKPOINTING,
        SuspendPhase.DELETING_SOURCE: views.DELETING_SOURCE,
        SuspendPhase.UNSTICKING: views.UNSTICKING,
        SuspendPhase.WAKING_IN_PLACE: views.WAKING_IN_PLACE,
    }

    def outcome(self, state: JsonObject, phase: str) -> Outcome:
        s = decode(SuspendState, state)
        if s.status is SuspendPhase.SUSPENDED:
            said = "Suspended", f"resume from {s.artifact}"
        elif s.status is SuspendPhase.CANCELLED:
            said = views.cancelled(None, "workload resumed in place")
        else:
            said = views.failed(s.failure, s.phase)
        return views.outcome_of(self, state, phase, said)

    def checkpoint(self, state: JsonObject) -> dict[str, str] | None:
        s = decode(SuspendState, state)
        return views.checkpoint_made(s.spec.artifact, s.capture.digest)
