"""Suspend/resume, restore of a stored checkpoint, a drain and a two-container pod on
real nodes (kubelet checkpoint API + CRI-O restore), through ``cpctl`` as a person runs it.

Each counter keeps its count and token only in its shell's memory. Each test asserts what
the runtime did: the restored container's own log (from the kubelet API) goes on from
the checkpointed count with the same token — no repeat and no gap where the capture was
quiesced —; the pod's status from the API server (Running, from its checkpoint image,
never restarted); every kubelet checkpoint directory is empty again. One world serves
the module; each test makes its own pods and leaves the nodes as it found them. The last
tests restore a sealed (encrypted) checkpoint, where CRI-O holds the key and where it
does not (their comment says how).
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
    consecutive,
    open_product_world,
    restored_status,
    went_on,
)
from tests.support.realnode import counter_command, ticks
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductWorld]:
    with open_product_world(tmp_path_factory.mktemp("realverbs")) as w:
        yield w


def test_a_suspended_counter_resumes_on_another_node_where_it_stopped(
        world: ProductWorld) -> None:
    w = world
    name = w.name("sus")
    before = w.start_counter(name, "node-a")
    source = w.real.pod(name)
    assert source is not None
    out = w.ok("suspend", f"{w.namespace}/{name}", "--repository", w.repository, "--wait",
               "--wait-seconds", "180")
    assert f"suspend {w.namespace}/{name}: Suspended" in out, out
    wait_for(lambda: w.real.pod(name) is None or None, f"{name} deleted by the suspend")
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}

    out = w.ok("resume", f"{w.namespace}/{name}", "--node", "node-b", "--repository",
               w.repository, "--wait", "--wait-seconds", "180")
    assert f"resume {w.namespace}/{name}: Resumed" in out, out
    ended = time.time()
    resumed = w.running_on(name, "node-b")
    assert resumed["metadata"]["uid"] != source["metadata"]["uid"]  # type: ignore[index]
    restored_status(resumed, w.repository)
    log = w.counting_since(name, "node-b", ended)
    consecutive(log)  # the archived lines, then the restored process's own: no repeat
    assert log[0][1] == before[0][1], "the same life: the token drawn at start"
    assert log[-1][0] > before[-1][0] + 3, "it counts on past what it printed before"
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    w.real.delete_pod(name)


def test_a_stored_checkpoint_restores_into_a_new_pod_while_the_source_runs_on(
        world: ProductWorld) -> None:
    w = world
    name, copy = w.name("ckp"), w.name("copy")
    w.start_counter(name, "node-a")
    source = w.real.pod(name)
    assert source is not None
    out = w.ok("checkpoint", f"{w.namespace}/{name}", "--repository", w.repository,
               "--wait", "--wait-seconds", "180")
    operation = out.split()[0]
    checkpointed = time.time()  # the archive's lines were all logged before this
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}

    out = w.ok("restore", operation, "--node", "node-b", "--name", copy, "--wait",
               "--wait-seconds", "180")
    ended = time.time()
    restored = w.running_on(copy, "node-b")
    restored_status(restored, w.repository)
    assert restored["metadata"]["annotations"][  # type: ignore[index]
        protocol.RESTORED_FROM_DIGEST].startswith("sha256:")
    w.counting_since(copy, "node-b", ended)
    archived, own = went_on(w.timed_ticks(copy, "node-b"), checkpointed)
    assert archived, "the restored log begins with the source's, as the archive held it"
    assert own, "the restored process printed lines of its own"
    # The archive holds the source's own lines: the same token, the same counts.
    on_source = ticks(w.real.container_log(name, node="node-a"))
    assert on_source[:len(archived)] == archived
    # The source was never stopped: the same pod counts on past the checkpoint.
    still = w.real.pod(name)
    assert still is not None
    assert still["metadata"]["uid"] == source["metadata"]["uid"]
    assert (still.get("status") or {}).get("phase") == "Running"
    more = wait_for(lambda: t if len(t := ticks(w.real.container_log(name, node="node-a")))
                    > len(on_source) else None, f"{name} counting on on node-a")
    consecutive(more)
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    w.real.delete_pod(copy)
    w.real.delete_pod(name)


def test_a_drain_moves_three_counters_with_their_memory(world: ProductWorld) -> None:
    w = world
    label = w.name("drain")
    names = [w.name(f"drn{i}") for i in range(3)]
    befores = {}
    for name in names:
        w.real.create_pod(name, "node-a", command=counter_command(),
                          labels={"app": name, "drain": label})
    for name in names:
        w.real.wait_running(name)
        befores[name] = w.ticking(name)
    try:
        out = w.ok("drain", "node-a", "--to", "node-b", "--selector", f"drain={label}",
                   "--repository", w.repository, "--wait", "--wait-seconds", "300")
        assert "drain node-a: Succeeded" in out, out
        ended = time.time()
        for name in names:
            moved = w.running_on(name, "node-b")
            restored_status(moved, w.repository)
            log = w.counting_since(name, "node-b", ended)
            consecutive(log)
            assert log[0][1] == befores[name][0][1], f"{name}: the same life"
            assert log[-1][0] > befores[name][-1][0] + 3
        assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    finally:  # a drain leaves its node cordoned, as kubectl drain does
        w.kube.request("PATCH", "/api/v1/nodes/node-a", {"spec": {"unschedulable": None}},
                       content_type="application/merge-patch+json")
        for name in names:
            w.real.delete_pod(name)


def test_both_counters_of_a_two_container_pod_migrate_and_go_on(world: ProductWorld) -> None:
    w = world
    name, containers = w.name("two"), ("main", "side")
    w.create_counters(name, "node-a", containers)
    w.real.wait_running(name)
    before = {c: w.ticking(name, c) for c in containers}
    assert before["main"][0][1] != before["side"][0][1], "two shells, two tokens"
    out = w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-b", "--repository",
               w.repository, "--wait", "--wait-seconds", "180")
    assert f"migrate {w.namespace}/{name}: Succeeded" in out, out
    ended = time.time()
    moved = w.running_on(name, "node-b")
    restored_status(moved, w.repository)
    images = {c["image"] for c in moved["spec"]["containers"]}  # type: ignore[index]
    assert len(images) == 2, f"one checkpoint image per container: {images}"
    for c in containers:
        log = w.counting_since(name, "node-b", ended, container=c)
        consecutive(log)
        assert log[0][1] == before[c][0][1], f"{c}: the same life"
        assert log[-1][0] > before[c][-1][0] + 3
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    w.real.delete_pod(name)


# --- sealed checkpoints (docs/security.md) -------------------------------------------------
#
# A counter on node-a is checkpointed under a class whose encryption.recipients names an
# EC P-256 public key: the agent seals each archive in ocicrypt's format and pushes the
# per-container checkpoint image CRI-O restores from with the same encrypted layer.
# CRI-O 1.36.3 reads the private keys in its decryption_keys_path at every pull, but
# containers/image decrypts only into a destination it may rewrite, never one named by
# digest (copy/single.go, containers/image#1768) -- the restore pod's form. The agent
# pulls each sealed image by its cpimage- tag and proves the pinned digest is then on
# the node (drivers/agent/kubelet.py). So, through the whole product: a node holding the
# key restores the sealed checkpoint and the process goes on; a node without it fails,
# naming the missing key as ocicrypt words it, and stores nothing. Each test sets the key
# folders it needs and empties them after.

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
