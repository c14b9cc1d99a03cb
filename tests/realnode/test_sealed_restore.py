"""Sealed checkpoints on real nodes: CRI-O decrypts them with its node's key, by tag only.

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

- by **digest**, the form the product's restore pod names (``repo@sha256:``), CRI-O
  refuses the image on every node, key or no key, and the restore fails with those words;
- by its **tag** (``cpimage-<hex of the digest>``), CRI-O on a node holding the key pulls,
  decrypts and restores it; the original manifest is kept beside the decrypted one
  (``storage/storage_dest.go``), so the digest form then resolves on that node and the
  product's restore succeeds there;
- a node without the key (or with another key) refuses the image by tag, naming the
  missing key as ocicrypt words it.

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
from tests.support.waiting import wait_for

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


def test_crio_refuses_a_sealed_image_named_by_digest_even_with_the_key(
        world: ProductWorld, sealed: Sealed) -> None:
    """The product's restore pod names the checkpoint image by digest: CRI-O's
    containers/image will not decrypt into a digested destination, whatever keys the
    node holds. This pins that behaviour; once the restore path pulls sealed images by
    tag, it should restore instead (as the next test does by hand)."""
    w = world
    node = w.real.node("node-a")
    assert node.crictl("inspecti", sealed.by_digest).returncode != 0, "not pulled yet"
    node.set_decryption_keys({"recipient.pem": sealed.key})
    try:
        done = w.cpctl("restore", sealed.operation, "--node", "node-a", "--name",
                       w.name("bydigest"), "--wait", "--wait-seconds", "180", cluster=True)
    finally:
        node.set_decryption_keys({})
    operation = done.stdout.split()[0]
    assert w.phase_of(operation) == "Failed", done.stdout + done.stderr
    [finished] = [e["data"] for e in w.history(operation) if e["type"] == "RestoreFinished"]
    message = finished["message"]
    assert "CRI-O did not restore container main: ErrImagePull" in message, finished
    assert "should be decrypted, but we can\N{RIGHT SINGLE QUOTATION MARK}t modify the " \
        "manifest: Destination specifies a digest" in message, finished


def test_crio_restores_a_sealed_image_with_the_key_in_its_decryption_keys_path(
        world: ProductWorld, sealed: Sealed) -> None:
    """With the recipient's key in node-b's ``decryption_keys_path``, a pod naming the
    checkpoint image by tag is pulled, decrypted and restored by CRI-O itself; the
    digest form then resolves on node-b, and the product's restore succeeds there."""
    w = world
    node = w.real.node("node-b")
    by_tag, restored = w.name("bytag"), w.name("sealcopy")
    # CRI-O restores onto the checkpointed container's base image and does not pull it:
    # the agent pulls it beforehand (``drivers.agent.kubelet``); here the test does.
    w.real.pull("node-b", sealed.base)
    node.set_decryption_keys({"recipient.pem": sealed.key})
    try:
        w.real.create_pod(by_tag, "node-b", image=sealed.by_tag)
        pod = w.real.wait_running(by_tag, limit=60)
        [status] = pod["status"]["containerStatuses"]
        assert status["restartCount"] == 0, status
        w.counting_since(by_tag, "node-b", sealed.checkpointed)
        archived, own = went_on(w.timed_ticks(by_tag, "node-b"), sealed.checkpointed)
        assert archived, "the restored log begins with the source's, as archived"
        assert own, "the restored process printed lines of its own"
        assert own[0][1] == sealed.token, "the checkpointed shell goes on"
        assert node.crictl("inspecti", sealed.by_digest).returncode == 0, \
            "the original manifest is kept: the digest form resolves on this node"

        out = w.ok("restore", sealed.operation, "--node", "node-b", "--name", restored,
                   "--wait", "--wait-seconds", "180")
        ended = time.time()
        assert w.phase_of(out.split()[0]) == "Succeeded", out
        copy = w.running_on(restored, "node-b")
        restored_status(copy, w.repository)
        assert copy["spec"]["containers"][0]["image"] == sealed.by_digest  # type: ignore[index]
        w.counting_since(restored, "node-b", ended)
        archived, own = went_on(w.timed_ticks(restored, "node-b"), sealed.checkpointed)
        assert archived
        assert own
        assert own[0][1] == sealed.token
        assert ticks(w.real.container_log(sealed.source, node="node-a"))[:len(archived)] == \
            archived, "the archive holds the source's own lines"
        assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    finally:
        node.set_decryption_keys({})
        w.real.delete_pod(by_tag)
        w.real.delete_pod(restored)


def pull_failures(w: ProductWorld, pod: str) -> str | None:
    """The kubelet's ``Failed`` events of ``pod`` (each names the runtime's error)."""
    events = w.kube.request(
        "GET", f"/api/v1/namespaces/{w.namespace}/events?fieldSelector="
        f"involvedObject.name={pod},reason=Failed")["items"]
    found = [str(e.get("message") or "") for e in events]
    return "\n".join(found) if any("decrypt" in m for m in found) else None


def test_a_node_without_the_key_refuses_the_sealed_image_naming_the_missing_key(
        world: ProductWorld, sealed: Sealed) -> None:
    """Pulled by tag on node-a, whose key folder is empty: the kubelet's pull fails with
    ocicrypt's "missing private key"; with another node's key there, with "none of the
    private keys could be used". Nothing of the image is stored."""
    w = world
    node = w.real.node("node-a")
    refused = w.name("nokey")
    node.set_decryption_keys({})
    try:
        w.real.create_pod(refused, "node-a", image=sealed.by_tag)
        failed = wait_for(lambda: pull_failures(w, refused), f"{refused}'s pull to fail")
        assert "decrypting layer" in failed, failed
        assert "missing private key needed for decryption" in failed, failed
        status = (w.real.pod(refused) or {}).get("status") or {}
        assert status.get("phase") == "Pending", status

        other = private_pem(ec.generate_private_key(ec.SECP256R1()))
        node.set_decryption_keys({"other.pem": other})
        pulled = node.crictl("pull", sealed.by_tag)
        assert pulled.returncode != 0
        assert "none of the private keys could be used for decryption" in pulled.stderr, \
            pulled.stderr
        assert "JWE: No suitable private key found for decryption" in pulled.stderr
    finally:
        node.set_decryption_keys({})
        w.real.delete_pod(refused)
    assert node.crictl("inspecti", sealed.by_digest).returncode != 0, "nothing was stored"
