"""A restore read from its state: it succeeded when the restored pod was verified. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base import views
from controlplane.machines.base.codec import decode
from controlplane.machines.base.views import Outcome
from controlplane.machines.restore.machine import RestorePhase, RestoreState


class RestoreView:
    success: frozenset[str] = frozenset({RestorePhase.SUCCEEDED})
    waiting: Mapping[str, str] = {
        RestorePhase.RESOLVING: "the registry to resolve the checkpoint",
        RestorePhase.RESTORING: views.RESTORING,
        RestorePhase.CLEANING_UP: "a failed restore's pod to be removed",
    }

    def outcome(self, state: JsonObject, phase: str) -> Outcome:
        s = decode(RestoreState, state)
        if s.status is RestorePhase.SUCCEEDED and s.restore is not None:
            node = s.restore.node or s.restore.plan.node
            said = "Verified", f"restored on {node} as instance {s.instance_id}"
        elif s.status is RestorePhase.CANCELLED:
            said = views.cancelled(s.failure)
        else:
            said = views.failed(s.failure, s.phase)
        return views.outcome_of(self, state, phase, said)

    def final_pod(self, state: JsonObject, phase: str) -> str | None:
        s = decode(RestoreState, state)
        return s.restore.plan.key if phase in self.success and s.restore else None

    def checkpoint(self, state: JsonObject) -> dict[str, str] | None:
        return None
