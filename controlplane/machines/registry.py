"""The machine kinds this build knows: ``default_kinds()`` is what the CLI and workers use.

``steps`` is the engine's own workload; the product kinds come from ``catalog``. Every
kind is registered so that history and replay work for any machine in the database.
"""

from __future__ import annotations

from controlplane.engine.kinds import KindRegistry
from controlplane.machines.catalog import product_kinds
from controlplane.machines.steps import StepsDecider


def default_kinds() -> KindRegistry:
    return KindRegistry([StepsDecider(), *product_kinds()])
