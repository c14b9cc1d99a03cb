"""A migration read from its state: it succeeded when the workload runs on the target and
its artifact is collected; rolled back (it runs on its source again) and cancelled count
as failed. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base import views
from controlplane.machines.base.codec import decode
from controlplane.machines.base.views import Outcome
from controlplane.machines.migration.state import MigrationPhase, MigrationState

#: Phases after which a restored pod runs (for a cancel: when the source had gone).
_RESTORED = frozenset({MigrationPhase.SUCCEEDED, MigrationPhase.ROLLED_BACK,
                       MigrationPhase.GC_FAILED})


class MigrationView(views.CapturingView, state=MigrationState,
                    success=frozenset({MigrationPhase.SUCCEEDED})):
    waiting: Mapping[str, str] = {
        # A streamed migration (class transfer: stream) restores on the target while the
        # source is frozen, and deletes the source only once the target is verified.
        # (Checkpointing reads the same either way: the registry must show it.)
        MigrationPhase.CHECKPOINTING: views.CHECKPOINTING,
        MigrationPhase.UNSTICKING: views.UNSTICKING + ", after any restore pod is removed",
        MigrationPhase.WAKING_IN_PLACE: views.WAKING_IN_PLACE + ", after any restore pod "
                                        "beside it is removed",
        MigrationPhase.DELETING_SOURCE: views.DELETING_SOURCE + " (streamed: the restored pod "
                                        "already runs verified; lazy: every page arrived)",
        # A lazy migration (mode lazy): the target runs before its memory has arrived.
        MigrationPhase.TARGET_RUNNING: "every page of the source's memory to reach the "
                                       "restored pod, which already runs (lazy)",
        MigrationPhase.CLEARING_LOST: "the restored pod and what is left of the source to "
                                      "be removed: the workload was lost (lazy)",
        MigrationPhase.RESTORING: views.RESTORING + " (streamed: restored from the source's "
                                  "agent and proven equal to the registry's checkpoint, the "
                                  "source kept frozen)",
        MigrationPhase.ADOPTING: "the ReplicaSet to adopt the restored pod, and the source "
                                 "to be gone",
        MigrationPhase.ROLLING_BACK: "the workload to be restored on its source node",
        MigrationPhase.COLLECTING_GARBAGE: views.COLLECTING_GARBAGE}

    def outcome(self, state: JsonObject, phase: str) -> Outcome:
        s = decode(MigrationState, state)
        collected = s.collection.outcome if s.collection else ""
        running = f"workload running on {s.final_node}" + (
            f"; artifact {collected}" if collected else "")
        if s.status is MigrationPhase.SUCCEEDED:
            said = "Migrated", running
        elif s.status is MigrationPhase.ROLLED_BACK:
            said = "RolledBack", running
        elif s.status is MigrationPhase.CANCELLED:
            # Retargeted back to its own node is the one way to end Cancelled uncancelled.
            reason = views.CANCELLED if s.cancelled else "RetargetedToSource"
            if s.collection is not None:  # the source had gone: restored where it was
                said = reason, running
            else:
                said = reason, f"workload resumed in place on {s.spec.source_node}"
        else:
            said = views.failed(s.failure, s.phase)
        reason, message = said
        return Outcome(phase in self.success, reason or phase, message)

    def final_pod(self, state: JsonObject, phase: str) -> str | None:
        """The last restore attempt's pod once verified; for a cancel, the pod it restored
        where the workload was when the source had already gone."""
        s = decode(MigrationState, state)
        if s.restore is None:
            return None
        if phase in _RESTORED or (phase == MigrationPhase.CANCELLED
                                  and s.collection is not None):
            return s.restore.plan.key
        return None

    def checkpoint(self, state: JsonObject) -> dict[str, str] | None:
        s = decode(MigrationState, state)
        return views.checkpoint_made(s.spec.capture.artifact, s.capture.digest)
