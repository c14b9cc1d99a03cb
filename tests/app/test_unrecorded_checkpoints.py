"""Checkpoints in the registry that the history does not record are found by provenance.

After a restore from a backup, the registry holds checkpoints made by operations the
restored history never saw. ``find_unrecorded`` lists exactly those: a manifest whose
``checkpoint-id`` names no machine and no pruned operation's summary; manifests without
our provenance are never listed (so ``--collect`` never deletes them).
"""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.app.unrecorded import collect, find_unrecorded
from controlplane.clock import FakeClock
from controlplane.machines.contract import protocol
from controlplane.machines.selftest.steps import StepsDecider
from controlplane.store import event_store
from controlplane.store.database import Database
from controlplane.store.records import Projection
from drivers.registry.layout import OciLayout
from drivers.registry.port import OCI_MANIFEST, Descriptor

REPO = "localhost:5000/checkpoints/app"
CONFIG = "application/vnd.oci.image.config.v1+json"


async def _push(registry: OciLayout, tag: str, annotations: dict[str, str]) -> str:
    layer = await registry.push_blob(REPO, tag.encode(), media_type="application/octet-stream")
    config = await registry.push_blob(REPO, b"{}", media_type=CONFIG)
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": Descriptor(CONFIG, config.digest, config.size).to_json(),
                       "layers": [layer.to_json()], "annotations": annotations},
                      sort_keys=True).encode()
    return await registry.push_manifest(REPO, body, media_type=OCI_MANIFEST, tag=tag)


def _provenance(checkpoint_id: str, created: str) -> dict[str, str]:
    return {protocol.MANIFEST_CHECKPOINT_ID: checkpoint_id,
            protocol.MANIFEST_SOURCE_POD_UID: f"uid-{checkpoint_id}",
            protocol.MANIFEST_NODE: "node-1", protocol.PREFIX + "pod": "default/web",
            "org.opencontainers.image.created": created}


async def test_only_checkpoints_no_recorded_operation_made_are_listed_and_collected(
        db: Database, clock: FakeClock, tmp_path: Path) -> None:
    state = StepsDecider().initial_state("known-op", {"steps": 1})
    await event_store.create_machine(
        db, machine_id="known-op", kind="steps", spec={"steps": 1},
        initial=Projection(state.phase, state.to_json(), False, None), now=clock.now(),
        worker_id="test")
    registry = OciLayout(tmp_path / "oci", gc_grace=0)
    await _push(registry, "ckpt-known-op", _provenance("known-op", "2026-11-01T00:00:00Z"))
    late = await _push(registry, "ckpt-after-backup",
                       _provenance("made-after-backup", "2026-11-02T00:00:00Z"))
    await _push(registry, "somebody-elses-image", {"org.example": "not ours"})

    found = await find_unrecorded(db, registry, [REPO])

    assert [(f.checkpoint_id, f.tag, f.digest, f.workload, f.node) for f in found] == [
        ("made-after-backup", "ckpt-after-backup", late, "default/web", "node-1")]
    assert await collect(registry, found) == 1
    assert await registry.list_tags(REPO) == ["ckpt-known-op", "somebody-elses-image"]
    assert await find_unrecorded(db, registry, [REPO]) == []
