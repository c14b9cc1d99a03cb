"""A migration whose target cannot start the checkpoint rolls back: the counter ends
running again on its source node, restored from the same checkpoint, with its memory.

How the target is made unable, honestly: CRI-O restores a container onto the base image
the checkpoint names and never pulls it; the agent pulls it first, by the digest the
source ran (a tag may have moved), unless the node holds it. The counter runs from an
image of its own; once it runs, that image is deleted from the registry (a registry
clean-up, an expired image). ``node-b`` never had it and cannot pull it; ``node-a``
still holds it, so the rollback's restore there works.

Asserted: the migration ends ``RolledBack`` and its history names node-b's failure; the
pod runs on node-a from its checkpoint image, never restarted; its own log goes on with
the same token, no repeat and no gap; nothing of it is left on node-b; every kubelet
checkpoint directory is empty again.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import pytest

from drivers.realnode import images
from tests.realnode.product import (
    ProductWorld,
    consecutive,
    open_product_world,
    restored_status,
)
from tests.support.realnode import counter_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductWorld]:
    with open_product_world(tmp_path_factory.mktemp("realrollback")) as w:
        yield w


def _push_base(w: ProductWorld, repository: str) -> str:
    """Busybox under ``repository:v1``, an image of this test's own."""
    layer = images.blob_of(images.rootfs_tar(
        {"bin/busybox": images.BUSYBOX},
        links={f"bin/{a}": "busybox" for a in images.APPLETS},
        dirs=("bin", "tmp", "proc", "sys", "dev", "etc")))
    return images.push_image(w.real.registry, repository, "v1", [layer],
                             config={"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]})


def _delete_manifest(w: ProductWorld, image_id: str) -> None:
    """Delete ``registry/repo@sha256:...`` from the registry (the image is then gone)."""
    name, _, digest = image_id.partition("@")
    repository = name.split("/", 1)[1]
    request = urllib.request.Request(
        f"http://{w.real.registry}/v2/{repository}/manifests/{digest}", method="DELETE")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 202, answer.status


def test_a_target_that_cannot_start_the_checkpoint_rolls_back_to_the_source(
        world: ProductWorld) -> None:
    w = world
    name = w.name("rb")
    base = _push_base(w, f"rollback/{name}")
    w.real.create_pod(name, "node-a", image=base, command=counter_command())
    running = w.real.wait_running(name)
    before = w.ticking(name)
    source = w.real.pod(name)
    assert source is not None
    _delete_manifest(w, running["status"]["containerStatuses"][0]["imageID"])

    done = w.cpctl("migrate", f"{w.namespace}/{name}", "--to", "node-b", "--repository",
                   w.repository, "--wait", "--wait-seconds", "240", cluster=True)
    operation = done.stdout.split()[0]
    assert w.phase_of(operation) == "RolledBack", done.stdout + done.stderr
    ended = time.time()
    [rollback] = [e for e in w.history(operation) if e["type"] == "RollbackStarted"]
    assert rollback["data"]["failed_node"] == "node-b", rollback
    assert rollback["data"]["node"] == "node-a", rollback
    assert "cannot pull" in rollback["data"]["message"], rollback

    back = w.running_on(name, "node-a")
    assert back["metadata"]["uid"] != source["metadata"]["uid"]  # type: ignore[index]
    restored_status(back, w.repository)
    log = w.counting_since(name, "node-a", ended)
    consecutive(log)  # restored from the quiesced checkpoint: no repeat, no gap
    assert log[0][1] == before[0][1], "the same life: the token drawn at start"
    assert log[-1][0] > before[-1][0] + 3
    on_b = [p["metadata"]["name"] for p in w.kube.pods(w.namespace)
            if p["spec"].get("nodeName") == "node-b"]
    assert not any(p.startswith(name) for p in on_b), f"left on node-b: {on_b}"
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    w.real.delete_pod(name)
