"""Sealed checkpoints on real nodes: CRI-O decrypts them with its node's key.

A counter on ``node-a`` is checkpointed (``cpctl checkpoint``, the source runs on) under
a class whose ``encryption.recipients`` names an EC P-256 public key: the agent seals
each archive in ocicrypt's format and pushes, besides the pod-level manifest, the
per-container checkpoint image CRI-O restores from, with the same encrypted layer.
CRI-O 1.36.3 reads the private keys in its ``decryption_keys_path`` at every pull
(``server/image_pull.go``, ``getDecryptionKeys``), and containers/image decrypts a layer
while it copies the image into storage — but only when it may rewrite the manifest
(``copy/encryption.go``: "should be decrypted, but we can't modify the manifest"), which
it never does for a destination named by digest (``copy/single.go``: "Destination
specifies a digest"; containers/image#1768). So, measured here:

the restore pod's digest form (``repo@sha256:``) is refused by CRI-O on every node. The
agent therefore pulls each sealed checkpoint image by its tag (``cpimage-<hex>``), which
CRI-O decrypts with the keys it holds, keeping the original manifest beside the
decrypted one (``storage/storage_dest.go``), proves the digest form now resolves, and
waits out the kubelet's failed first pull (``drivers/agent/kubelet.py``). So, measured
here, through the whole product:

- on a node holding the recipient's key, ``cpctl restore`` of the sealed checkpoint
  succeeds and the process goes on from its checkpoint;
- on a node without it, the restore fails, its history naming the missing key as
  ocicrypt words it, and nothing of the image is stored.

Each test sets the key folders it needs and empties them after. One world serves the
module; the source pod is deleted at its end.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from controlplane.machines.contract import protocol
from drivers.registry.artifact import CRIU_ROOTFS_IMAGE_NAME
from drivers.registry.checkpoint_images import TAG_PREFIX
from tests.realnode.product import (
    ProductWorld,
    open_product_world,
    restored_status,
    went_on,
)
from tests.support.realnode import ticks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ENCRYPTED = "application/vnd.oci.image.layer.v1.tar+encrypted"
OCICRYPT = ("org.opencontainers.image.enc.keys.jwe", "org.opencontainers.image.enc.pubopts")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class Sealed:
    """One sealed checkpoint of a counter that runs on on ``node-a``."""

    operation: str  # the ``cpctl checkpoint`` that took it
    source: str  # the counter pod
    token: str  # the counter's token: a restored copy goes on with it
    checkpointed: float  # epoch seconds: every archived line was logged before
    manifest: dict[str, Any]  # the pod-level manifest
    by_digest: str  # the container's checkpoint image, as a restore pod names it
    by_tag: str  # the same image by its ``cpimage-`` tag
    base: str  # the image the checkpointed container ran from
    key: bytes  # the recipient's private key (PEM)


def private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def registry_get(w: ProductWorld, path: str) -> bytes:
    request = urllib.request.Request(f"http://{w.real.registry}/v2/{path}",
                                     headers={"Accept": OCI_MANIFEST})
    with urllib.request.urlopen(request, timeout=30) as answer:
        body: bytes = answer.read()
        return body


def manifest_of(w: ProductWorld, digest: str) -> dict[str, Any]:
    repository = w.repository.split("/", 1)[1]
    found: dict[str, Any] = json.loads(registry_get(w, f"{repository}/manifests/{digest}"))
    return found


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductWorld]:
    with open_product_world(tmp_path_factory.mktemp("realsealed")) as w:
        yield w


@pytest.fixture(scope="module")
def sealed(world: ProductWorld, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sealed]:
    w = world
    keys = tmp_path_factory.mktemp("sealkeys")
    recipient = ec.generate_private_key(ec.SECP256R1())
    (keys / "recipient.pub").write_bytes(recipient.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    classes = keys / "classes.yaml"
    classes.write_text(json.dumps({"classes": [{
        "name": "sealed", "repository": w.repository,
        "encryption": {"recipients": [f"file:{keys / 'recipient.pub'}"]}}]}))
    source = w.name("sealed")
    before = w.start_counter(source, "node-a")
    try:
        out = w.ok("checkpoint", f"{w.namespace}/{source}", "--class", "sealed",
                   "--classes-file", str(classes), "--wait", "--wait-seconds", "180")
        checkpointed = time.time()
        operation = out.split()[0]
        assert f"checkpoint {w.namespace}/{source}: Succeeded" in out, out
        digest = w.get(operation)["state"]["capture"]["digest"]
        manifest = manifest_of(w, digest)
        named = manifest["annotations"][protocol.MANIFEST_CONTAINER_IMAGES]
        container, _, image = named.partition("=")
        assert container == "main", named
        yield Sealed(operation, source, before[0][1], checkpointed, manifest,
                     f"{w.repository}@{image}",
                     f"{w.repository}:{TAG_PREFIX}{image.removeprefix('sha256:')}",
                     manifest["annotations"][CRIU_ROOTFS_IMAGE_NAME], private_pem(recipient))
    finally:
        w.real.delete_pod(source)


def test_a_sealed_class_pushes_only_ocicrypt_layers_also_in_the_image_crio_restores(
        world: ProductWorld, sealed: Sealed) -> None:
    """Both the pod-level manifest and the container's checkpoint image carry one
    ``+encrypted`` layer with ocicrypt's annotations, and no archive file name is
    readable in the pushed blob."""
    w = world
    image = manifest_of(w, sealed.by_digest.partition("@")[2])
    for manifest in (sealed.manifest, image):
        assert [layer["mediaType"] for layer in manifest["layers"]] == [ENCRYPTED], manifest
        for layer in manifest["layers"]:
            assert all(layer["annotations"].get(k) for k in OCICRYPT), layer
    assert image["annotations"]["io.kubernetes.cri-o.annotations.checkpoint.name"] == "main"
    [layer] = image["layers"]
    repository = w.repository.split("/", 1)[1]
    blob = registry_get(w, f"{repository}/blobs/{layer['digest']}")
    for name in (b"spec.dump", b"config.dump", b"checkpoint/"):  # a plain archive's files
        assert name not in blob, f"{name!r} readable in the pushed layer"


def test_the_product_restores_a_sealed_checkpoint_where_crio_holds_the_key(
        world: ProductWorld, sealed: Sealed) -> None:
    """With the recipient's key in node-b's ``decryption_keys_path``, ``cpctl restore``
    succeeds there: the agent pulls the checkpoint image by its tag (CRI-O decrypts only
    then), proves the pinned digest is on the node, and the kubelet's retry of its digest
    pull finds it; the restored process goes on from its checkpoint."""
    w = world
    node = w.real.node("node-b")
    restored = w.name("sealcopy")
    assert node.crictl("inspecti", sealed.by_digest).returncode != 0, "not pulled yet"
    node.set_decryption_keys({"recipient.pem": sealed.key})
    try:
        out = w.ok("restore", sealed.operation, "--node", "node-b", "--name", restored,
                   "--wait", "--wait-seconds", "180")
        ended = time.time()
        assert w.phase_of(out.split()[0]) == "Succeeded", out
        copy = w.running_on(restored, "node-b")
        restored_status(copy, w.repository)
        assert copy["spec"]["containers"][0]["image"] == sealed.by_digest  # type: ignore[index]
        w.counting_since(restored, "node-b", ended)
        archived, own = went_on(w.timed_ticks(restored, "node-b"), sealed.checkpointed)
        assert archived, "the restored log begins with the source's, as archived"
        assert own, "the restored process printed lines of its own"
        assert own[0][1] == sealed.token, "the checkpointed shell goes on"
        assert ticks(w.real.container_log(sealed.source, node="node-a"))[:len(archived)] == \
            archived, "the archive holds the source's own lines"
    finally:
        node.set_decryption_keys({})
        w.real.delete_pod(restored)


def test_a_node_without_the_key_refuses_the_sealed_checkpoint_naming_the_missing_key(
        world: ProductWorld, sealed: Sealed) -> None:
    """``cpctl restore`` onto node-a, whose key folder is empty: the operation fails, its
    history naming ocicrypt's "missing private key"; nothing of the image is stored."""
    w = world
    node = w.real.node("node-a")
    node.set_decryption_keys({})
    done = w.cpctl("restore", sealed.operation, "--node", "node-a", "--name",
                   w.name("nokey"), "--wait", "--wait-seconds", "180", cluster=True)
    operation = done.stdout.split()[0]
    assert w.phase_of(operation) == "Failed", done.stdout + done.stderr
    [finished] = [e["data"] for e in w.history(operation) if e["type"] == "RestoreFinished"]
    assert "Unsealable: CRI-O could not pull the sealed checkpoint image" in \
        finished["message"], finished
    assert "missing private key needed for decryption" in finished["message"], finished
    assert node.crictl("inspecti", sealed.by_digest).returncode != 0, "nothing was stored"
