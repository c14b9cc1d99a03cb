"""A checkpoint read from its state: it succeeded when its artifact was verified. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base import views
from controlplane.machines.base.codec import decode
from controlplane.machines.base.views import Outcome
from controlplane.machines.checkpoint.machine import CheckpointPhase, CheckpointState


class CheckpointView(views.NoPodNoCheckpoint):
    success: frozenset[str] = frozenset({CheckpointPhase.SUCCEEDED})
    waiting: Mapping[str, str] = {
        CheckpointPhase.REQUESTED: views.CAPTURE_REQUESTED,
        CheckpointPhase.CAPTURED: views.CAPTURED,
        CheckpointPhase.VERIFIED: views.RELEASING,
        CheckpointPhase.UNSTICKING: views.UNSTICKING,
    }

    def outcome(self, state: JsonObject, phase: str) -> Outcome:
        s = decode(CheckpointState, state)
        if s.status is CheckpointPhase.SUCCEEDED:
            verified = f"artifact verified as {s.artifact}"
            op = s.source_op
            if s.spec.quiesce:
                said = "Verified", f"{verified}; workload left stopped (quiesce)"
            elif op is not None and op.failure is not None:
                said = "Verified", f"{verified}; request not withdrawn: {op.failure.message}"
            else:
                said = "Verified", f"{verified}; capture request withdrawn"
        elif s.status is CheckpointPhase.CANCELLED:
            said = views.cancelled(s.failure)
        else:
            said = views.failed(s.failure, s.phase)
        return views.outcome_of(self, state, phase, said)

    def checkpoint(self, state: JsonObject) -> dict[str, str] | None:
        s = decode(CheckpointState, state)
        return views.checkpoint_made(s.spec.artifact, s.capture.digest)
