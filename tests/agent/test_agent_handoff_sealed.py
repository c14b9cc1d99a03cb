"""A sealed, signed capture handed off: the registry copy is sealed as the class says, the
target restores from the stream, and the manifest's ``archive-digests`` are the PLAIN
archives' digests — the same the target received — not the ciphertexts'."""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.machines.contract import protocol
from drivers.agent.sealing import Sealing, SealingSettings
from drivers.sim import MARKER
from tests.agent.handoff_world import (
    HANDOFF,
    NS,
    handoff_value,
    restore_pod,
    restored,
    source,
)
from tests.agent.test_agent_sealed import seal, write_pair
from tests.agent.world import open_world

SEALED = "application/vnd.oci.image.layer.v1.tar+encrypted"


async def test_a_sealed_capture_lists_the_plain_digests_the_target_received(
        tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("signing", "recipient"):
        write_pair(keys, name)
    settings = SealingSettings(signing_key=keys / "signing.pem",
                               trusted_keys=(keys / "signing.pub",))
    sealing = {node: Sealing.load(settings) for node in ("node-1", "node-2")}
    async with open_world(tmp_path, sealing=sealing, handoff=HANDOFF) as w:
        await source(w, marker="sealed-state")
        w.request_capture(NS, "app", "ck-s", quiesce=True, extra={
            **seal("ck-s", f"file:{keys / 'recipient.pub'}"),
            protocol.CAPTURE_HANDOFF: handoff_value("ck-s")})
        restore_pod(w, "app-r", "ck-s")
        notes = await restored(w, "app-r")
        assert notes.get(protocol.RESTORE_FAILURE) is None
        assert notes[MARKER] == "sealed-state"
        restored_from = protocol.handoff_restored(notes)
        assert restored_from is not None

        assert await w.report(NS, "app", "Pushed", "Failed") == "Pushed"
        digest = w.annotations(NS, "app")[protocol.REPORT_DIGEST]
        manifest = json.loads((await w.backend.registry.get_manifest(w.repo, digest)).body)
        assert {layer["mediaType"] for layer in manifest["layers"]} == {SEALED}
        listed = protocol.archive_digests(manifest["annotations"])
        assert listed == restored_from[1]
        assert set(listed.values()).isdisjoint(
            layer["digest"] for layer in manifest["layers"])  # not the ciphertexts

