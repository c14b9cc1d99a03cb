"""A migration's capture is not failed on a watch cache's stale copy of its source.

Fault seed 14 (``docs/reliability.md``, bug 8): a resumed pods watch said "synced" before
applying its backlog, and the worker failed a capture as ``SourceGone`` from a stale
``Pending`` copy of a source the API server had Running. A decision that fails a step is
now confirmed by reading the pods through first (``Decision.confirm``).
"""

from __future__ import annotations

from controlplane.app.operations import submit
from controlplane.clock import FakeClock
from controlplane.machines.catalog import default_kinds
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.worker.actions import ActionRunner
from controlplane.worker.loop import Worker, WorkerConfig
from tests.machines.machines_gwt import NS, POD, migration_body, pod
from tests.support.workers import FAST_RETRIES, RecordingHandler, ScriptedObserver, run_until

SRC = f"{NS}/{POD}"


def _worker(db: Database, clock: FakeClock, cache: ScriptedObserver,
            confirm: ScriptedObserver | None) -> Worker:
    accept = RecordingHandler()
    handlers = {t: accept for t in ("AnnotatePod", "EmitEvent", "DeletePod",
                                     "RemovePodAnnotations")}
    return Worker(db, default_kinds(), cache, ActionRunner(handlers, FAST_RETRIES), clock,
                  WorkerConfig(worker_id="w1", poll_seconds=0.01), confirm=confirm)


async def _requested_or_failed(db: Database) -> bool:
    types = [e.type for e in await queries.history(db, "mig-1")]
    return "CaptureRequested" in types or "CaptureFailed" in types


async def _run(db: Database, clock: FakeClock, confirm: ScriptedObserver | None) -> list[str]:
    await submit(db, default_kinds(), kind="migration", machine_id="mig-1",
                 spec=migration_body({}), now=clock.now())  # type: ignore[arg-type]
    stale = ScriptedObserver({SRC: pod(phase="Pending")})
    await run_until(_worker(db, clock, stale, confirm), lambda: _requested_or_failed(db))
    return [e.type for e in await queries.history(db, "mig-1")]


async def test_a_capture_is_not_failed_on_a_stale_cached_copy_of_a_running_source(
    db: Database, clock: FakeClock
) -> None:
    server = ScriptedObserver({SRC: pod(phase="Running")})
    history = await _run(db, clock, confirm=server)
    assert "CaptureRequested" in history
    assert "CaptureFailed" not in history
    assert server.looks == 1


async def test_without_the_confirming_read_the_stale_copy_fails_the_capture(
    db: Database, clock: FakeClock
) -> None:
    """The control: the same cache alone fails it as SourceGone."""
    history = await _run(db, clock, confirm=None)
    assert "CaptureFailed" in history
