"""A resume read from its state: it succeeded when the workload runs again, restored from
its checkpoint or cold-booted from its spec. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.machines.base import views
from controlplane.machines.resume.machine import ResumePhase, ResumeState


class ResumeView(views.RestoringView, state=ResumeState, success=frozenset({ResumePhase.RESUMED})):
    waiting: Mapping[str, str] = {
        ResumePhase.SELECTING: "a checkpoint to resume from",
        ResumePhase.RESTORING: views.RESTORING,
        ResumePhase.COLD_BOOTING: "the pod to start from its spec (no usable checkpoint)"}

    def succeeded(self, s: ResumeState) -> tuple[str, str]:
        r = s.restore
        assert r is not None
        how = "cold-booted" if r.plan.artifact is None else f"restored from {r.plan.artifact}"
        return "Resumed", f"{how} as {r.plan.key} on {r.node or r.plan.node}"

    def cancelled(self, s: ResumeState) -> tuple[str, str]:
        return views.cancelled(None)
