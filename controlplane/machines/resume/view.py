"""A resume read from its state: it succeeded when the workload runs again, restored from
its checkpoint or cold-booted from its spec. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base import views
from controlplane.machines.base.codec import decode
from controlplane.machines.base.views import Outcome
from controlplane.machines.resume.machine import ResumePhase, ResumeState


class ResumeView:
    success: frozenset[str] = frozenset({ResumePhase.RESUMED})
    waiting: Mapping[str, str] = {
        ResumePhase.SELECTING: "a checkpoint to resume from",
        ResumePhase.RESTORING: views.RESTORING,
        ResumePhase.COLD_BOOTING: "the pod to start from its spec (no usable checkpoint)",
    }

    def outcome(self, state: JsonObject, phase: str) -> Outcome:
        s = decode(ResumeState, state)
        r = s.restore
        if s.status is ResumePhase.RESUMED and r is not None:
            how = ("cold-booted" if r.plan.artifact is None
                   else f"restored from {r.plan.artifact}")
            said = "Resumed", f"{how} as {r.plan.key} on {r.node or r.plan.node}"
        elif s.status is ResumePhase.CANCELLED:
            said = views.cancelled(None)
        else:
            said = views.failed(s.failure, s.phase)
        return views.outcome_of(self, state, phase, said)

    def final_pod(self, state: JsonObject, phase: str) -> str | None:
        s = decode(ResumeState, state)
        return s.restore.plan.key if phase in self.success and s.restore else None

    def checkpoint(self, state: JsonObject) -> dict[str, str] | None:
        return None
