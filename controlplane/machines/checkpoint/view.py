"""A checkpoint read from its state: it succeeded when its artifact was verified. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base import views
from controlplane.machines.checkpoint.machine import CheckpointPhase, CheckpointState


class CheckpointView(views.CapturingView, state=CheckpointState,
                     success=frozenset({CheckpointPhase.SUCCEEDED})):
    waiting: Mapping[str, str] = {
        CheckpointPhase.REQUESTED: views.CAPTURE_REQUESTED,
        CheckpointPhase.CAPTURED: views.CAPTURED, CheckpointPhase.VERIFIED: views.RELEASING,
        CheckpointPhase.UNSTICKING: views.UNSTICKING}

    def final_pod(self, state: JsonObject, phase: str) -> str | None:
        """The source, once captured and left running (not with ``quiesce``)."""
        s = self.decoded(state)
        return None if phase not in self.success or s.spec.quiesce else str(s.spec.pod_key)

    def succeeded(self, s: CheckpointState) -> tuple[str, str]:
        verified = f"artifact verified as {s.artifact}"
        op = s.source_op
        if s.spec.quiesce:
            return "Verified", f"{verified}; workload left stopped (quiesce)"
        if op is not None and op.failure is not None:
            return "Verified", f"{verified}; request not withdrawn: {op.failure.message}"
        return "Verified", f"{verified}; capture request withdrawn"
