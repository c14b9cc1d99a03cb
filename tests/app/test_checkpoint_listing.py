"""``list_checkpoints`` (what ``cpctl checkpoints`` shows), on SQLite and PostgreSQL, over
histories written through the event store: each verified capture once, newest first,
with the node, class, size and pinned artifact its events recorded; restorable exactly
when ``cpctl restore`` takes its kind and no garbage collection deleted (or is deleting)
its artifact — and the ``restorable_only`` filter, done in SQL, agrees with the reason
shown; one query whatever the length of the histories."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from controlplane.app.checkpoints import list_checkpoints
from controlplane.clock import FakeClock
from controlplane.engine.decider import Event
from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.contract.protocol import MANIFEST_NODE
from controlplane.machines.stages.capture import ArtifactVerified
from controlplane.machines.stages.collect import (
    ArtifactDeleted,
    ArtifactDeletionFailed,
    ArtifactDeletionRequested,
    ArtifactKept,
    GarbageCollectionAbandoned,
)
from controlplane.store import event_store
from controlplane.store.database import Database
from controlplane.store.records import Projection

REPO = "registry.test/ckpt"


async def record_capture(db: Database, clock: FakeClock, machine_id: str, *, kind: str,
                         workload: str = "default/app", node: str | None = "node-1",
                         submitted_on: str | None = "node-1", size: int | None = 10240,
                         klass: JsonObject | None = None, after: Sequence[str] = (),
                         padding: int = 0) -> None:
    """A machine of ``kind`` whose capture the registry verified, then ``padding``
    unrelated events and the garbage-collection events ``after``."""
    clock.advance(60)
    ns, name = workload.split("/")
    spec: JsonObject = {"pod": {"namespace": ns, "name": name, "uid": f"uid-{machine_id}"},
                        "class": klass if klass is not None
                        else {"name": "gpu", "repository": REPO}}
    await event_store.create_machine(
        db, machine_id=machine_id, kind=kind, spec=spec,
        initial=Projection("Checkpointing", {}, False), now=clock.now(), worker_id="op",
        workload=workload, source_node=submitted_on)
    digest = "sha256:" + machine_id.encode().hex().ljust(64, "0")[:64]
    annotations: JsonObject = {} if node is None else {MANIFEST_NODE: node}
    verified = Event(ArtifactVerified.NAME, {
        "at": clock.now().isoformat(), "digest": digest, "artifact": f"{REPO}:{machine_id}",
        "pinned": f"{REPO}@{digest}", **({} if size is None else {"size_bytes": size})},
        {"tag": f"{REPO}:{machine_id}", "tag_present": True, "tag_digest": digest,
         "tag_annotations": annotations})
    events = [verified, *(Event("Noted", {"n": i}) for i in range(padding)),
              *(Event(t, {"artifact": f"{REPO}@{digest}"}) for t in after)]
    await event_store.commit(db, machine_id=machine_id, expected_version=1, events=events,
                             projection=Projection("Done", {}, True), cause="command",
                             decision_input={}, now=clock.now(), worker_id="w1")


async def test_each_verified_capture_is_listed_newest_first_with_what_it_recorded(
    db: Database, clock: FakeClock,
) -> None:
    await record_capture(db, clock, "ck-1", kind="checkpoint", node="node-2",
                         submitted_on="node-9", size=3 * 2**20)
    await record_capture(db, clock, "sus-1", kind="suspend", workload="ns/sandbox",
                         node=None, submitted_on="node-3", size=None,
                         klass={"repository": REPO})
    found, total = await list_checkpoints(db)
    assert total == 2
    assert [c.checkpoint_id for c in found] == ["sus-1", "ck-1"]
    suspend, checkpoint = found
    assert (checkpoint.kind, checkpoint.workload, checkpoint.node, checkpoint.klass,
            checkpoint.size_bytes) == ("checkpoint", "default/app", "node-2", "gpu", 3 * 2**20)
    assert checkpoint.artifact.startswith(f"{REPO}@sha256:")
    assert checkpoint.tag == f"{REPO}:ck-1"
    assert (checkpoint.restorable, checkpoint.why_not) == (True, None)
    # No node annotation on the manifest: the node the pod was on at submission. An
    # unnamed class shows its repository; an undeclared size stays unknown.
    assert (suspend.node, suspend.klass, suspend.size_bytes, suspend.restorable) == (
        "node-3", REPO, None, True)
    item = checkpoint.to_json()
    assert item["verified_at"] == checkpoint.verified_at.isoformat()
    assert (item["id"], item["size_bytes"], item["restorable"], item["gc_event"]) == (
        "ck-1", 3 * 2**20, True, None)


@pytest.mark.parametrize(("kind", "after", "why"), [
    ("migration", [ArtifactDeletionRequested.NAME, ArtifactDeleted.NAME],
     "deleted by garbage collection after the migration's verified restore"),
    ("migration", [ArtifactDeletionRequested.NAME],
     "being deleted by garbage collection after the migration's restore"),
    ("migration", [ArtifactDeletionRequested.NAME, ArtifactDeletionFailed.NAME],
     "being deleted by garbage collection after the migration's restore"),
    ("migration", [ArtifactKept.NAME],
     "a migration's capture: cpctl restore takes checkpoints and suspends"),
    ("migration", [ArtifactDeletionRequested.NAME, GarbageCollectionAbandoned.NAME],
     "a migration's capture: cpctl restore takes checkpoints and suspends"),
    ("migration", [], "a migration's capture: cpctl restore takes checkpoints and suspends"),
    ("checkpoint", [ArtifactDeletionRequested.NAME, ArtifactDeleted.NAME],
     "deleted by garbage collection after the checkpoint's verified restore"),
    ("suspend", [ArtifactKept.NAME], None),
])
async def test_restorable_says_why_not_and_the_filter_agrees(
    db: Database, clock: FakeClock, kind: str, after: list[str], why: str | None,
) -> None:
    await record_capture(db, clock, "op-1", kind=kind, after=after)
    [listed], _ = await list_checkpoints(db)
    assert listed.why_not == why
    assert listed.gc_event == (after[-1] if after else None)
    assert (listed.gc_at is not None) == bool(after)
    restorable, total = await list_checkpoints(db, restorable_only=True)
    assert [c.checkpoint_id for c in restorable] == ([] if why else ["op-1"])
    assert total == len(restorable)


async def test_a_workload_filter_and_a_limit_cut_the_list_and_total_counts_every_match(
    db: Database, clock: FakeClock,
) -> None:
    for i in range(4):
        await record_capture(db, clock, f"ck-{i}", kind="checkpoint")
    await record_capture(db, clock, "other", kind="checkpoint", workload="default/other")
    await record_capture(db, clock, "moved", kind="migration", after=[ArtifactDeleted.NAME])
    found, total = await list_checkpoints(db, workload="default/app", limit=2)
    assert ([c.checkpoint_id for c in found], total) == (["moved", "ck-3"], 5)
    found, total = await list_checkpoints(db, workload="default/app", restorable_only=True,
                                          limit=2)
    assert ([c.checkpoint_id for c in found], total) == (["ck-3", "ck-2"], 4)
    assert await list_checkpoints(db, workload="default/ghost") == ([], 0)


@contextmanager
def counted_selects(db: Database) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    engine = db.reader.sync_engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", count)


async def test_listing_costs_one_query_whatever_the_history_length(
    db: Database, clock: FakeClock,
) -> None:
    """One statement for the rows (a second only when the limit cuts the list), never
    one per machine or per event."""
    for i in range(12):
        await record_capture(db, clock, f"op-{i}", kind="migration" if i % 2 else "suspend",
                             padding=40, after=[ArtifactDeletionRequested.NAME,
                                                ArtifactDeleted.NAME] if i % 2 else [])
    with counted_selects(db) as seen:
        found, total = await list_checkpoints(db)
    assert (len(found), total, len(seen)) == (12, 12, 1)
    with counted_selects(db) as seen:
        found, total = await list_checkpoints(db, restorable_only=True, limit=3)
    assert (len(found), total, len(seen)) == (3, 6, 2)
