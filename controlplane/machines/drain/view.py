"""A drain read from its state: it keeps its own finish reason and message. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base import views
from controlplane.machines.base.views import Outcome
from controlplane.machines.drain.state import DrainPhase, DrainState


class DrainView(views.KindView, state=DrainState, success=frozenset({DrainPhase.SUCCEEDED})):
    waiting: Mapping[str, str] = {
        DrainPhase.CORDONING: "the node to be cordoned",
        DrainPhase.DRAINING: "the drain's child migrations",
        DrainPhase.UNCORDONING: "the node to be uncordoned"}

    def outcome(self, state: JsonObject, phase: str) -> Outcome:
        s: DrainState = self.decoded(state)
        return Outcome(phase in self.success, s.reason or s.phase, s.message)
