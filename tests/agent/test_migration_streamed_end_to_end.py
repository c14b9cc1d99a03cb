"""A streamed migration end to end (class ``transfer: stream``): the engine's migration
machine, the drivers and node agents holding the shared handoff key.

The machine asks for the capture with ``capture-handoff`` and creates the restore pod
with ``restore-handoff`` in one decision; the target's agent restores from the source
agent's stream while the push goes on; the restored pod is verified only once the
registry proved the artifact and its ``archive-digests`` equal what the target restored;
only then is the source deleted. Pins that the machine and the agents speak one protocol.
"""

from __future__ import annotations

from pathlib import Path

from controlplane.app.operations import submit
from controlplane.clock import SystemClock
from controlplane.machines.catalog import default_kinds
from controlplane.machines.contract import protocol
from controlplane.store import queries
from drivers.sim import MARKER
from tests.agent.engine import open_engine
from tests.agent.handoff_world import NS, TARGET, handoff_world, source
from tests.agent.test_migration_end_to_end import migration_spec, restored_pods
from tests.support.waiting import eventually


async def test_a_streamed_migration_restores_from_the_handoff_before_deleting_the_source(
        tmp_path: Path) -> None:
    async with handoff_world(tmp_path) as w:
        await source(w)
        spec = migration_spec(w)
        klass = spec["class"]
        assert isinstance(klass, dict)
        # Keep the checkpoint, so the registry's copy can be read after the migration.
        spec["class"] = {**klass, "transfer": "stream",
                         "retention": {"delete_after_migration": False}}
        async with open_engine(w, tmp_path) as db:
            await submit(db, default_kinds(), kind="migration",
                         spec=spec,  # type: ignore[arg-type]
                         machine_id="mig-s", now=SystemClock().now())

            async def finished() -> bool:
                return (await queries.get_machine(db, "mig-s")).terminal

            await eventually(finished, limit_seconds=60, what="the migration to finish")
            record = await queries.get_machine(db, "mig-s")
            events = [e.type for e in await queries.history(db, "mig-s")]
        assert record.phase == "Succeeded", events
        assert w.cluster.pod(NS, "app") is None
        [pod] = restored_pods(w)
        notes = pod["metadata"]["annotations"]
        assert pod["spec"]["nodeName"] == TARGET
        assert notes[MARKER] == "counter=41"
        assert protocol.RESTORE_HANDOFF in notes
        assert protocol.RESTORE_ARTIFACT not in notes
        marked = protocol.handoff_restored(notes)
        assert marked is not None
        assert marked[0] == "mig-s"
        assert notes[protocol.INSTANCE_ID].startswith(pod["metadata"]["uid"])
        assert pod["metadata"].get("labels", {}).get("app") == "demo"  # handed back
        # One decision asked for the capture and created the restore pod.
        assert events.index("RestorePodRequested") == events.index("CaptureRequested") + 1
        assert events.index("ArtifactVerified") < events.index("RestoreVerified") \
            < events.index("SourceDeletionRequested") < events.index("SourceDeleted")
        tag = await w.backend.registry.resolve(
            w.repo, f"{NS}.app.mig-s")
        assert tag is not None
        assert protocol.archive_digests(tag.annotations) == marked[1]
