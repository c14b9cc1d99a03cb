"""A restore read from its state: it succeeded when the restored pod was verified. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.machines.base import views
from controlplane.machines.restore.machine import RestorePhase, RestoreState


class RestoreView(views.RestoringView, state=RestoreState,
                  success=frozenset({RestorePhase.SUCCEEDED})):
    waiting: Mapping[str, str] = {
        RestorePhase.RESOLVING: "the registry to resolve the checkpoint",
        RestorePhase.RESTORING: views.RESTORING,
        RestorePhase.CLEANING_UP: "a failed restore's pod to be removed"}

    def succeeded(self, s: RestoreState) -> tuple[str, str]:
        assert s.restore is not None
        node = s.restore.node or s.restore.plan.node
        return "Verified", f"restored on {node} as instance {s.instance_id}"
