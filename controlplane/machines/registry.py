"""The machine kinds this build runs: ``default_kinds()`` is what the CLI and workers use."""

from __future__ import annotations

from controlplane.engine.kinds import KindRegistry
from controlplane.machines.steps import StepsDecider


def default_kinds() -> KindRegistry:
    return KindRegistry([StepsDecider()])
