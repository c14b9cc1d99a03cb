"""The node agent's restore side on the simulator: the state comes back, with a fresh identity.

Pins gate 2's evidence: a pod created with the restore annotation naming an artifact by
digest is marked by the agent on its node with ``restored-from-digest`` = that digest and
an ``instance-id`` never seen before (bound to the new pod's UID, so marks copied from a
template never count), and the workload's state (the simulator's marker) is back; a
restore that cannot be done is reported in ``restore-failure``, not left silent.
"""

from __future__ import annotations

from controlplane.machines.contract import protocol
from drivers.sim import MARKER
from tests.agent.world import World

NS = "default"


async def capture(w: World, name: str, checkpoint_id: str, *, marker: str) -> str:
    w.cluster.create_pod(NS, name, node="node-1", marker=marker)
    await w.running(NS, name)
    w.request_capture(NS, name, checkpoint_id, quiesce=True)
    await w.report(NS, name, "Pushed")
    return w.annotations(NS, name)[protocol.REPORT_DIGEST]


def restore_pod(w: World, name: str, *, digest: str, checkpoint_id: str | None,
                extra: dict[str, str] | None = None) -> None:
    notes = protocol.restore_request(artifact=f"{w.repo}@{digest}", restore_key=f"m/{name}",
                                     checkpoint_id=checkpoint_id, loader="{}")
    w.cluster.create_pod(NS, name, node="node-2", annotations={**(extra or {}), **notes})


async def restored(w: World, name: str) -> dict[str, str]:
    await w.cluster.wait_for(
        lambda: bool(w.annotations(NS, name).get(protocol.INSTANCE_ID, "").startswith(
            w.uid(NS, name)) or w.annotations(NS, name).get(protocol.RESTORE_FAILURE)),
        limit_seconds=15, what=f"{name} restored or failed")
    return w.annotations(NS, name)


async def test_restore_onto_a_new_pod_brings_the_marker_back_with_a_fresh_identity(
        world: World) -> None:
    digest = await capture(world, "app", "ck-1", marker="counter=41")
    restore_pod(world, "app-r1", digest=digest, checkpoint_id="ck-1")
    notes = await restored(world, "app-r1")
    assert notes.get(protocol.RESTORE_FAILURE) is None
    assert notes[protocol.RESTORED_FROM_DIGEST] == digest
    instance = notes[protocol.INSTANCE_ID]
    assert instance.startswith(world.uid(NS, "app-r1") + ".")
    assert instance != world.annotations(NS, "app").get(protocol.INSTANCE_ID, "")
    assert notes[MARKER] == "counter=41"
    pod = world.cluster.pod(NS, "app-r1")
    assert pod is not None
    assert pod["spec"]["nodeName"] == "node-2"


async def test_two_restores_of_one_artifact_get_distinct_instance_ids(
        layout_world: World) -> None:
    w = layout_world
    digest = await capture(w, "app", "ck-1", marker="m")
    restore_pod(w, "r1", digest=digest, checkpoint_id="ck-1")
    restore_pod(w, "r2", digest=digest, checkpoint_id="ck-1")
    first, second = await restored(w, "r1"), await restored(w, "r2")
    assert first[protocol.INSTANCE_ID] != second[protocol.INSTANCE_ID]
    assert first[MARKER] == second[MARKER] == "m"


async def test_marks_copied_from_a_template_do_not_count_as_restored(
        layout_world: World) -> None:
    """A template saved from a restored pod carries its marks; the agent restores anyway."""
    w = layout_world
    digest = await capture(w, "app", "ck-1", marker="fresh")
    restore_pod(w, "r1", digest=digest, checkpoint_id="ck-1", extra={
        protocol.RESTORED_FROM_DIGEST: digest, protocol.INSTANCE_ID: "old-uid.12345678",
        MARKER: "stale"})
    notes = await restored(w, "r1")
    assert notes[protocol.INSTANCE_ID] != "old-uid.12345678"
    assert notes[MARKER] == "fresh"


async def test_restore_of_an_absent_artifact_reports_a_failure(world: World) -> None:
    restore_pod(world, "r1", digest="sha256:" + "0" * 64, checkpoint_id=None)
    notes = await restored(world, "r1")
    assert "NotFound" in notes[protocol.RESTORE_FAILURE]
    assert protocol.INSTANCE_ID not in notes


async def test_restore_naming_another_checkpoint_is_refused(layout_world: World) -> None:
    w = layout_world
    digest = await capture(w, "app", "ck-1", marker="m")
    restore_pod(w, "r1", digest=digest, checkpoint_id="ck-other")
    notes = await restored(w, "r1")
    assert notes[protocol.RESTORE_FAILURE].startswith("RestoreFailed: ")
    assert "ck-other" in notes[protocol.RESTORE_FAILURE]
    assert MARKER not in notes


async def test_a_pod_without_a_restore_request_is_left_alone(layout_world: World) -> None:
    w = layout_world
    w.cluster.create_pod(NS, "plain", node="node-2", marker="mine")
    digest = await capture(w, "app", "ck-1", marker="m")  # the agents have caught up since
    assert digest
    notes = w.annotations(NS, "plain")
    assert protocol.INSTANCE_ID not in notes
    assert notes[MARKER] == "mine"
