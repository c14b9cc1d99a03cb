"""The worker's periodic housekeeping: history partitions made ahead, and the retention
prune when a policy is configured (``cpctl worker --history-keep-days``).

Started by ``cpctl worker`` (``cli/worker.py``) beside the worker loop: the first round
at start, then one every ``period_seconds`` (hourly by default). Both jobs are safe from
several workers at once (partitions under an advisory lock; the prune's summaries are
idempotent and its deletes re-check under a lock). A failure is logged and retried next
period; it never stops the worker.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from controlplane.clock import Clock
from controlplane.logs import get_logger
from controlplane.store import partitions, retention
from controlplane.store.database import Database

log = get_logger("controlplane.housekeeping")
HOUR = 3600.0


@dataclass
class Housekeeping:
    """One worker's housekeeping; :meth:`run` until cancelled."""

    db: Database
    clock: Clock
    policy: retention.Policy
    period_seconds: float = HOUR
    batch: int = 500
    rounds: int = 0
    failures: int = 0

    async def round(self) -> None:
        """Partitions ahead, then the prune (if a policy is set); errors logged, not raised."""
        self.rounds += 1
        try:
            made = await partitions.create_ahead(self.db, now=self.clock.now())
            if made:
                log.info("history partitions created", partitions=made)
        except Exception as exc:  # retried next period: never kills the worker
            self.failures += 1
            log.warning("creating history partitions failed; retrying next period",
                        error=f"{type(exc).__name__}: {exc}")
        if not self.policy.configured:
            return
        try:
            report = await retention.prune(self.db, policy=self.policy, now=self.clock.now(),
                                           batch=self.batch,
                                           progress=lambda line: log.debug(line))
            if report.summarized or report.machines_deleted:
                log.info("history pruned", operations=report.summarized,
                         events=report.events_deleted, machines=report.machines_deleted,
                         partitions=report.partitions_dropped)
        except Exception as exc:  # retried next period: never kills the worker
            self.failures += 1
            log.warning("pruning history failed; retrying next period",
                        error=f"{type(exc).__name__}: {exc}")

    async def run(self) -> None:
        while True:
            await self.round()
            await asyncio.sleep(self.period_seconds)
