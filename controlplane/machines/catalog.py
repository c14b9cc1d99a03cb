"""The machine kinds this build knows, for the engine to register.

``product_kinds()`` returns one decider per product kind: ``checkpoint``, ``restore``,
``migration``, ``suspend``, ``resume`` and ``drain``. ``default_kinds()`` adds the engine's
own ``steps`` workload: it is what the CLI, the API and the workers use, so that history
and replay work for any machine in the database.
"""

from __future__ import annotations

from typing import Any

from controlplane.engine.decider import Decider
from controlplane.engine.kinds import KindRegistry
from controlplane.machines.checkpoint.machine import CheckpointDecider, CheckpointState
from controlplane.machines.drain.machine import DrainDecider, DrainState
from controlplane.machines.migration.machine import MigrationDecider, MigrationState
from controlplane.machines.restore.machine import RestoreDecider, RestoreState
from controlplane.machines.resume.machine import ResumeDecider, ResumeState
from controlplane.machines.selftest.steps import StepsDecider
from controlplane.machines.suspend.machine import SuspendDecider, SuspendState


def product_kinds() -> list[Decider[Any]]:
    """Fresh deciders for every product kind (they hold no state)."""
    # Typed bindings make mypy check each class against the Decider protocol.
    checkpoint: Decider[CheckpointState] = CheckpointDecider()
    restore: Decider[RestoreState] = RestoreDecider()
    migration: Decider[MigrationState] = MigrationDecider()
    suspend: Decider[SuspendState] = SuspendDecider()
    resume: Decider[ResumeState] = ResumeDecider()
    drain: Decider[DrainState] = DrainDecider()
    return [checkpoint, restore, migration, suspend, resume, drain]


def default_kinds() -> KindRegistry:
    """Every kind, the engine's ``steps`` included."""
    return KindRegistry([StepsDecider(), *product_kinds()])
