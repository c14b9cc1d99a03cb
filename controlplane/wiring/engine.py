"""The worker over the engine's own kinds, with no cluster: ``cpctl worker`` without
``--kubeconfig`` (the ``steps`` kind's work action does nothing; the product kinds'
actions need a cluster, so a product machine waits for a worker that has one)."""

from __future__ import annotations

from typing import Any

from controlplane.clock import Clock
from controlplane.machines.catalog import default_kinds
from controlplane.machines.selftest.steps import WORK_ACTION
from controlplane.store.database import Database
from controlplane.worker.actions import ActionRunner, RetryPolicy
from controlplane.worker.loop import Worker, WorkerConfig
from controlplane.worker.ports import NullObserver


async def _noop(_action: Any) -> None:
    return None


def build_worker(db: Database, config: WorkerConfig, clock: Clock) -> Worker:
    """The worker the CLI runs without a cluster: this build's kinds, no observer."""
    actions = ActionRunner({WORK_ACTION: _noop}, RetryPolicy())
    return Worker(db, default_kinds(), NullObserver(), actions, clock, config)
