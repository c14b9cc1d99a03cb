"""A CRI-O restore that the kubelet asked for before the agent had pulled the base image.

The restore pod names its checkpoint images from birth, so the kubelet may ask CRI-O to
restore while the agent's ``crictl pull`` of the base image still runs; CRI-O then says
``locating image with ID <id>: image not known`` and the kubelet asks again after its
back-off. The agent waits for that retry when the node holds the image by then, and fails
the restore at once when it does not, or when the kubelet does not retry in time.

The agent's ``crictl`` here is a real script that keeps the node's images in a file: a
pull adds the image's name and ID, ``inspecti`` finds either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from controlplane.machines.contract import protocol
from drivers.agent import kubelet
from drivers.agent.dumper import RestoreRequest, Workload
from drivers.agent.errors import RestoreFailed
from drivers.agent.kubelet import KubeletDumper, KubeletSettings
from drivers.registry.artifact import CheckpointArtifact, Layer
from drivers.registry.port import Descriptor

BASE = "registry.test/base@sha256:" + "b" * 64
BASE_ID = "1d" * 32
CHECKPOINT = "sha256:" + "c" * 64
CONTAINER_ID = "e" * 64

CRICTL = """#!/bin/sh
# crictl --runtime-endpoint E --image-endpoint E <verb> <image>
held={held}
case "$5" in
  inspecti) grep -qx -- "$6" "$held" 2>/dev/null ;;
  pull) printf '%s\\n%s\\n' "$6" {base_id} >> "$held" ;;
  *) exit 2 ;;
esac
"""


def lacking(image_id: str) -> dict[str, Any]:
    return {"status": {"containerStatuses": [{"name": "main", "state": {"waiting": {
        "reason": "CreateContainerError",
        "message": f'reading image "{image_id}": locating image with ID "{image_id}": '
                   "image not known"}}}]}}  # CRI-O 1.36.3's words


RUNNING = {"status": {"containerStatuses": [{
    "name": "main", "image": "x", "containerID": f"cri-o://{CONTAINER_ID}",
    "state": {"running": {}}}]}}


class Node:
    """A fake crictl over a file of images, the container's cgroup, and the pod's
    statuses as the agent sees them one after the other."""

    def __init__(self, tmp: Path) -> None:
        self.held = tmp / "images"
        self.crictl = tmp / "crictl"
        self.crictl.write_text(CRICTL.format(held=self.held, base_id=BASE_ID))
        self.crictl.chmod(0o755)
        self.cgroups = tmp / "cgroup"
        scope = self.cgroups / "pids" / "pod" / f"crio-{CONTAINER_ID}"
        scope.mkdir(parents=True)
        for level in (self.cgroups / "pids", scope):
            (level / "cgroup.procs").write_text("")

    def dumper(self) -> KubeletDumper:
        return KubeletDumper(KubeletSettings(cri_endpoint="unix:///run/crio.sock",
                                             crictl=str(self.crictl),
                                             cgroup_root=self.cgroups))

    def request(self, statuses: Sequence[Mapping[str, Any]]) -> RestoreRequest:
        seen = iter(statuses)

        async def latest(_wait: float) -> Mapping[str, Any] | None:
            await asyncio.sleep(0)
            return next(seen)

        layer = Layer("main", Descriptor("application/vnd.oci.image.layer.v1.tar",
                                         "sha256:" + "a" * 64, 1), image=BASE)
        artifact = CheckpointArtifact(
            {protocol.MANIFEST_CONTAINER_IMAGES: f"main={CHECKPOINT}"}, (layer,))
        return RestoreRequest(Workload("default", "r", "uid-r", "node-b"), CHECKPOINT,
                              artifact, {}, "{}", latest=latest)


async def test_a_restore_cri_o_tried_before_the_base_was_pulled_waits_for_the_retry(
        tmp_path: Path) -> None:
    node = Node(tmp_path)
    request = node.request([lacking(BASE_ID), lacking(BASE_ID), RUNNING])
    await node.dumper().restore(request)
    assert BASE in node.held.read_text().split(), "the agent pulled the base image"


async def test_an_image_the_node_still_lacks_fails_the_restore_at_once(
        tmp_path: Path) -> None:
    node = Node(tmp_path)
    other = "2f" * 32
    request = node.request([lacking(other), RUNNING])
    with pytest.raises(RestoreFailed, match=f'CreateContainerError: reading image "{other}": '
                                            f'locating image with ID "{other}": image not '
                                            "known$"):
        await node.dumper().restore(request)


async def test_a_kubelet_that_does_not_retry_in_time_fails_the_restore(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubelet, "RETRY_SECONDS", 0.0)
    node = Node(tmp_path)
    request = node.request([lacking(BASE_ID), lacking(BASE_ID), RUNNING])
    with pytest.raises(RestoreFailed, match=r"image not known \(the node has held that "
                                            r"image for 0s and the kubelet did not retry\)"):
        await node.dumper().restore(request)

