"""The engine's own ``steps`` workload read from its state. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base import views
from controlplane.machines.base.views import Outcome
from controlplane.machines.selftest.steps import StepsPhase


class StepsView(views.KindView, success=frozenset({StepsPhase.SUCCEEDED})):
    waiting: Mapping[str, str] = {StepsPhase.RUNNING: "its next step",
                                  StepsPhase.WAITING: "its next check"}

    def outcome(self, state: JsonObject, phase: str) -> Outcome:
        return Outcome(phase in self.success, phase, "")
