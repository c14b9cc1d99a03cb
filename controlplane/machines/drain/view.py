"""A drain read from its state: it keeps its own finish reason and message. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.base import views
from controlplane.machines.base.codec import decode
from controlplane.machines.base.views import Outcome
from controlplane.machines.drain.state import DrainPhase, DrainState


class DrainView(views.NoPodNoCheckpoint):
    success: frozenset[str] = frozenset({DrainPhase.SUCCEEDED})
    waiting: Mapping[str, str] = {
        DrainPhase.CORDONING: "the node to be cordoned",
        DrainPhase.DRAINING: "the drain's child migrations",
        DrainPhase.UNCORDONING: "the node to be uncordoned",
    }

    def outcome(self, state: JsonObject, phase: str) -> Outcome:
        s = decode(DrainState, state)
        return views.outcome_of(self, state, phase, (s.reason or s.phase, s.message))
