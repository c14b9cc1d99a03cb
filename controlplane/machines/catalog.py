"""The product's machine kinds, for the engine to register.

``product_kinds()`` returns one decider per kind: ``checkpoint``, ``restore``,
``migration``, ``suspend``, ``resume`` and ``drain``. Called by the runtime/CLI when it builds its
:class:`~controlplane.engine.kinds.KindRegistry`, and by submission validation.
"""

from __future__ import annotations

from typing import Any

from controlplane.engine.decider import Decider
from controlplane.machines.checkpoint import CheckpointDecider, CheckpointState
from controlplane.machines.drain import DrainDecider, DrainState
from controlplane.machines.migration import MigrationDecider, MigrationState
from controlplane.machines.restore import RestoreDecider, RestoreState
from controlplane.machines.resume import ResumeDecider, ResumeState
from controlplane.machines.suspension import SuspendDecider, SuspendState


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
