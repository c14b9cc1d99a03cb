"""The machine kinds this build knows: for each, its decider, how it is asked for and how
it is read — ``Kind(decider, request, view)``, all three pure and beside each other in the
kind's folder (``machine.py``, ``request.py``, ``view.py``).

``product_kinds()`` returns the deciders of the product kinds: ``checkpoint``,
``restore``, ``migration``, ``suspend``, ``resume`` and ``drain``. ``default_kinds()`` adds
the engine's own ``steps`` workload: it is what the CLI, the API and the workers use, so
that history and replay work for any machine in the database. :func:`kind` and
:func:`view_of` look one up by name.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from controlplane.engine.decider import Decider
from controlplane.engine.kinds import KindRegistry
from controlplane.errors import UsageError
from controlplane.machines.base.requests import RequestKind
from controlplane.machines.base.views import View
from controlplane.machines.checkpoint.machine import (
    CheckpointDecider,
    CheckpointPhase,
    CheckpointState,
)
from controlplane.machines.checkpoint.request import CheckpointRequests
from controlplane.machines.checkpoint.view import CheckpointView
from controlplane.machines.drain.machine import DrainDecider, DrainState
from controlplane.machines.drain.request import DrainRequests
from controlplane.machines.drain.state import DrainPhase
from controlplane.machines.drain.view import DrainView
from controlplane.machines.migration.machine import MigrationDecider, MigrationState
from controlplane.machines.migration.request import MigrationRequests
from controlplane.machines.migration.state import MigrationPhase
from controlplane.machines.migration.view import MigrationView
from controlplane.machines.restore.machine import RestoreDecider, RestorePhase, RestoreState
from controlplane.machines.restore.request import RestoreRequests
from controlplane.machines.restore.view import RestoreView
from controlplane.machines.resume.machine import ResumeDecider, ResumePhase, ResumeState
from controlplane.machines.resume.request import ResumeRequests
from controlplane.machines.resume.view import ResumeView
from controlplane.machines.selftest.steps import StepsDecider, StepsPhase
from controlplane.machines.selftest.view import StepsView
from controlplane.machines.suspend.machine import SuspendDecider, SuspendPhase, SuspendState
from controlplane.machines.suspend.request import SuspendRequests
from controlplane.machines.suspend.view import SuspendView


@dataclass(frozen=True)
class Kind:
    """One machine kind: how it decides, how it is asked for (``None``: only the engine
    creates it) and how it is read."""

    decider: Decider[Any]
    request: RequestKind | None
    view: View

    @property
    def name(self) -> str:
        return self.decider.kind


@functools.cache
def kinds() -> dict[str, Kind]:
    """Every kind by name (they hold no state: built once)."""
    # Typed bindings make mypy check each class against the Decider protocol.
    checkpoint: Decider[CheckpointState] = CheckpointDecider()
    restore: Decider[RestoreState] = RestoreDecider()
    migration: Decider[MigrationState] = MigrationDecider()
    suspend: Decider[SuspendState] = SuspendDecider()
    resume: Decider[ResumeState] = ResumeDecider()
    drain: Decider[DrainState] = DrainDecider()
    all_kinds = [
        Kind(StepsDecider(), None, StepsView()),
        Kind(checkpoint, CheckpointRequests(), CheckpointView()),
        Kind(restore, RestoreRequests(), RestoreView()),
        Kind(migration, MigrationRequests(), MigrationView()),
        Kind(suspend, SuspendRequests(), SuspendView()),
        Kind(resume, ResumeRequests(), ResumeView()),
        Kind(drain, DrainRequests(), DrainView()),
    ]
    return {k.name: k for k in all_kinds}


def kind(name: str) -> Kind:
    """The kind ``name``, or a ``UsageError`` listing the known ones."""
    found = kinds().get(name)
    if found is None:
        raise UsageError(f"unknown kind {name!r}", hint="one of " + ", ".join(kinds()))
    return found


def requested(name: str) -> tuple[Kind, RequestKind]:
    """A kind operators ask for, and its requests (``steps`` is the engine's own)."""
    found = kind(name)
    if found.request is None:
        asked = ", ".join(requested_kinds())
        raise UsageError(f"kind {name!r} is not submitted as an operation",
                         hint=f"one of {asked}")
    return found, found.request


def requested_kinds() -> list[str]:
    """The kinds operators ask for, by name."""
    return [k for k, v in kinds().items() if v.request is not None]


def view_of(name: str) -> View | None:
    """How a kind is read (``None``: a kind this build does not know)."""
    found = kinds().get(name)
    return found.view if found else None


def phase_names() -> list[str]:
    """Every phase some kind can be in, sorted: what ``list --phase`` matches."""
    phases = (CheckpointPhase, RestorePhase, MigrationPhase, SuspendPhase, ResumePhase,
              DrainPhase, StepsPhase)
    return sorted({phase.value for enum in phases for phase in enum})


def success_phases() -> frozenset[str]:
    """Every phase some kind counts as success (for SQL over all kinds)."""
    return frozenset().union(*(k.view.success for k in kinds().values()))


def product_kinds() -> list[Decider[Any]]:
    """Fresh deciders for every product kind (they hold no state)."""
    return [k.decider for k in kinds().values() if k.request is not None]


def default_kinds() -> KindRegistry:
    """Every kind, the engine's ``steps`` included."""
    return KindRegistry([k.decider for k in kinds().values()])
