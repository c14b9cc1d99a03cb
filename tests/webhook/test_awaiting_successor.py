"""The store's answer to the webhook (SQLite and PostgreSQL): only a live migration of
exactly that ``namespace/name`` whose spec says ``successor: gated`` awaits the pod."""

from __future__ import annotations

from typing import Any

from controlplane.clock import FakeClock
from controlplane.engine.decider import Event
from controlplane.store import event_store
from controlplane.store.database import Database
from controlplane.store.records import Projection
from controlplane.store.successors import awaiting_successor


async def create(db: Database, clock: FakeClock, machine_id: str, *, workload: str,
                 kind: str = "migration", **spec: Any) -> None:
    await event_store.create_machine(
        db, machine_id=machine_id, kind=kind, spec=spec,
        initial=Projection("Pending", {}, False), now=clock.now(), worker_id="op",
        workload=workload)


async def finish(db: Database, clock: FakeClock, machine_id: str) -> None:
    await event_store.commit(
        db, machine_id=machine_id, expected_version=1, events=[Event("Cancelled", {})],
        projection=Projection("Cancelled", {}, True), cause="command", decision_input={},
        now=clock.now(), worker_id="op")


async def test_a_live_gated_migration_of_the_pod_awaits_its_successor(
    db: Database, clock: FakeClock
) -> None:
    await create(db, clock, "mig-1", workload="prod/db-0", successor="gated")
    assert await awaiting_successor(db, "prod", "db-0") == "mig-1"


async def test_other_pods_namespaces_and_successor_modes_await_nothing(
    db: Database, clock: FakeClock
) -> None:
    await create(db, clock, "mig-1", workload="prod/db-0", successor="gated")
    await create(db, clock, "mig-2", workload="prod/web-0", successor="adopt")
    await create(db, clock, "mig-3", workload="prod/bare")
    assert await awaiting_successor(db, "prod", "db-1") is None
    assert await awaiting_successor(db, "staging", "db-0") is None
    assert await awaiting_successor(db, "prod", "web-0") is None
    assert await awaiting_successor(db, "prod", "bare") is None


async def test_another_kind_on_the_workload_awaits_nothing(
    db: Database, clock: FakeClock
) -> None:
    await create(db, clock, "ck-1", workload="prod/db-0", kind="checkpoint",
                 successor="gated")
    assert await awaiting_successor(db, "prod", "db-0") is None


async def test_a_finished_migration_awaits_nothing(db: Database, clock: FakeClock) -> None:
    """Once terminal, a later StatefulSet recreation of the same name starts normally."""
    await create(db, clock, "mig-1", workload="prod/db-0", successor="gated")
    await finish(db, clock, "mig-1")
    assert await awaiting_successor(db, "prod", "db-0") is None
    await create(db, clock, "mig-2", workload="prod/db-0", successor="gated")
    assert await awaiting_successor(db, "prod", "db-0") == "mig-2"


async def test_a_name_with_sql_wildcards_matches_only_itself(
    db: Database, clock: FakeClock
) -> None:
    await create(db, clock, "mig-1", workload="prod/db-0", successor="gated")
    assert await awaiting_successor(db, "prod", "db-%") is None
    assert await awaiting_successor(db, "pro_", "db-0") is None
