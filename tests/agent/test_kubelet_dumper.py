"""The ``kubelet`` dumper against a fake kubelet over HTTPS: the ContainerCheckpoint API.

No real kubelet runs here, so a tiny aiohttp server plays one on loopback, with TLS (a
self-signed serving certificate for ``127.0.0.1`` made by ``openssl`` for the test run)
and the kubelet's authentication (a bearer token, or a client certificate it trusts)
and authorisation (``create nodes/checkpoint``). It answers as upstream's
``checkpoint`` handler does: ``POST /checkpoint/{namespace}/{pod}/{container}`` writes a
real tar into the node's checkpoint directory and answers 200 ``{"items": ["<kubelet
path>"]}``; 404 ``pod does not exist`` / ``container X does not exist``; 500
``checkpointing of ns/pod/container failed (<runtime error>)``; 401 without credentials
it accepts; 403 for an identity not allowed ``nodes/checkpoint``.

Pins: the agent verifies the kubelet's certificate against its CA file (an untrusted one
is refused before a request, hence before the token, is sent); it pushes that exact
archive as the artifact's single layer with the CRI-O / CRIU annotations and our
provenance; it empties the node's checkpoint directory; every refusal becomes a
``DumpFailed`` naming the HTTP status and the kubelet's message.
"""

from __future__ import annotations

import io
import json
import re
import ssl
import subprocess
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from controlplane.engine.observation import TagView
from controlplane.machines.contract import protocol
from drivers.agent.dumper import Container, DumpRequest, Workload
from drivers.agent.errors import DumpFailed
from drivers.agent.kubelet import (
    FORMAT,
    KubeletDumper,
    KubeletSettings,
    base_image,
    restored_containers,
)
from drivers.agent.pods import PodPatcher
from drivers.registry import RegistryObserver
from drivers.registry.artifact import (
    ARCHIVE_BYTES,
    CONFIG_TYPE,
    CONTAINERS,
    CRIO_CHECKPOINT_NAME,
    CRIU_CONTAINER_NAME,
    CRIU_POD_NAME,
    CRIU_POD_NAMESPACE,
    CRIU_ROOTFS_IMAGE_NAME,
    DUMPER,
    LAYER_TYPE,
    OCI_CREATED,
    OCI_TITLE,
    POD,
    Provenance,
)
from drivers.registry.checkpoints import Archive, push_checkpoint
from drivers.registry.port import OCI_MANIFEST, Registry, sha256_digest
from tests.agent.world import open_world

NS = "default"
KUBELET_DIR = "/var/lib/kubelet/checkpoints"
AGENT = "system:serviceaccount:cp-system:node-agent"
VIEWER = "system:serviceaccount:default:viewer"
AGENT_CERT_USER = "system:node-agent:node-1"
CRIU_ERROR = ("rpc error: code = Unknown desc = failed to checkpoint container 3f2a: "
              "running \"/usr/bin/criu\": exit status 1")


# --- certificates --------------------------------------------------------------------------

@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    kubelet: KeyPair  # the kubelet's serving certificate: self-signed, so also its CA file
    other: KeyPair  # another self-signed 127.0.0.1 certificate: a CA that trusts nothing here
    agent: KeyPair  # the agent's client certificate, trusted by the kubelet
    stranger: KeyPair  # a key pair the kubelet never heard of (its key fits no other cert)


def self_signed(where: Path, name: str, subject: str, *extra: str) -> KeyPair:
    pair = KeyPair(where / f"{name}.crt", where / f"{name}.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(pair.key), "-out", str(pair.cert), "-subj", subject,
                    *extra], check=True, capture_output=True)
    return pair


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    where = tmp_path_factory.mktemp("pki")
    serving = ("-addext", "subjectAltName=IP:127.0.0.1")
    return Pki(kubelet=self_signed(where, "kubelet", "/CN=127.0.0.1", *serving),
               other=self_signed(where, "other", "/CN=127.0.0.1", *serving),
               agent=self_signed(where, "agent", f"/CN={AGENT_CERT_USER}"),
               stranger=self_signed(where, "stranger", "/CN=stranger"))


# --- the fake kubelet ----------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    path: str
    user: str  # who the kubelet authenticated ("" when nobody)
    timeout: str


@dataclass
class FakeKubelet:
    node_dir: Path
    ca_file: Path  # what a client must trust
    tokens: dict[str, str] = field(default_factory=lambda: {
        "agent-token": AGENT, "viewer-token": VIEWER})
    allowed: set[str] = field(default_factory=lambda: {AGENT, AGENT_CERT_USER})
    pods: dict[tuple[str, str], set[str]] = field(default_factory=lambda: {
        (NS, "app"): {"main"}})
    runtime_error: str = ""  # set: the runtime (CRIU) fails every checkpoint
    calls: list[Call] = field(default_factory=list)
    written: dict[str, bytes] = field(default_factory=dict)  # archive name -> bytes
    url: str = ""

    def authenticate(self, request: web.Request) -> str:
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return self.tokens.get(header[7:], "")
        assert request.transport is not None
        peer = request.transport.get_extra_info("peercert")  # only verified certificates
        if peer:
            return str(next(v for rdn in peer["subject"] for k, v in rdn if k == "commonName"))
        return ""

    async def checkpoint(self, request: web.Request) -> web.Response:
        ns, pod, container = (request.match_info[k] for k in ("ns", "pod", "container"))
        user = self.authenticate(request)
        self.calls.append(Call(request.path, user, request.query.get("timeout", "")))
        if not user:
            return web.Response(status=401, text="Unauthorized")
        if user not in self.allowed:
            return web.Response(status=403, text=f"Forbidden (user={user}, verb=create, "
                                                 "resource=nodes, subresource=checkpoint)")
        if (ns, pod) not in self.pods:
            return web.Response(status=404, text="pod does not exist")
        if container not in self.pods[ns, pod]:
            return web.Response(status=404, text=f"container {container} does not exist")
        if self.runtime_error:
            return web.Response(status=500, text=f"checkpointing of {ns}/{pod}/{container} "
                                                 f"failed ({self.runtime_error})")
        stamp = f"2026-01-01T00:00:{len(self.written):02d}Z"
        name = f"checkpoint-{pod}_{ns}-{container}-{stamp}.tar"
        with tarfile.open(self.node_dir / name, "w") as tar:
            for member, content in [("config.dump", b'{"id":"3f2a"}'),
                                    ("checkpoint/pages-1.img", f"criu pages of {ns}/{pod}/"
                                                               f"{container}".encode())]:
                info = tarfile.TarInfo(member)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
        self.written[name] = (self.node_dir / name).read_bytes()
        return web.json_response({"items": [f"{KUBELET_DIR}/{name}"]})


@pytest.fixture
async def kubelet(tmp_path: Path, pki: Pki) -> AsyncIterator[FakeKubelet]:
    node_dir = tmp_path / "node1-checkpoints"
    node_dir.mkdir()
    fake = FakeKubelet(node_dir, pki.kubelet.cert)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pki.kubelet.cert, pki.kubelet.key)
    tls.load_verify_locations(pki.agent.cert)  # the kubelet's client CA
    tls.verify_mode = ssl.CERT_OPTIONAL  # a token alone is fine too
    app = web.Application()
    app.router.add_post("/checkpoint/{ns}/{pod}/{container}", fake.checkpoint)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls).start()
    fake.url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    yield fake
    await runner.cleanup()


def settings(fake: FakeKubelet, **changes: object) -> KubeletSettings:
    base = KubeletSettings(url=fake.url, token="agent-token", ca_file=str(fake.ca_file),
                           checkpoint_dir=fake.node_dir, kubelet_checkpoint_dir=KUBELET_DIR,
                           timeout=30)
    return replace(base, **changes)  # type: ignore[arg-type]


def dump_request(tmp_path: Path, pod: str = "app", container: str = "main") -> DumpRequest:
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    wanted = (Container(container, "quay.io/app:1"),)
    return DumpRequest("ck-1", Workload(NS, pod, "uid-1", "node-1", wanted), wanted,
                       quiesce=False, saver="{}", workdir=workdir)


# --- capture through the agent -------------------------------------------------------------

@pytest.mark.parametrize("registry", ["layout", "distribution"])
async def test_kubelet_checkpoint_over_https_is_pushed_as_a_cri_o_checkpoint_image(
        tmp_path: Path, kubelet: FakeKubelet, registry: str) -> None:
    """The archive the kubelet wrote is the artifact's only layer, byte for byte (digest =
    its sha256, uncompressed tar media type), under an OCI image manifest whose config
    lists it as the rootfs diff and whose annotations are exactly CRI-O's checkpoint
    annotations plus our provenance; the tag passes gate 1 for this checkpoint."""
    def factory(patcher: PodPatcher) -> KubeletDumper:
        return KubeletDumper(settings(kubelet))

    async with open_world(tmp_path, registry=registry, dumpers={"node-1": factory}) as w:
        w.cluster.create_pod(NS, "app", node="node-1", image="quay.io/app:1")
        await w.running(NS, "app")
        artifact = w.request_capture(NS, "app", "ck-k")
        await w.report(NS, "app", "Pushed", "Failed")
        notes = w.annotations(NS, "app")
        assert notes[protocol.REPORT_STATE] == "Pushed", notes.get(protocol.REPORT_REASON)
        assert kubelet.calls == [Call("/checkpoint/default/app/main", AGENT, "30")]
        assert list(kubelet.node_dir.iterdir()) == []  # taken off the node
        [archive] = kubelet.written.values()
        reg, repo, digest = w.backend.registry, w.repo, notes[protocol.REPORT_DIGEST]

        manifest = await reg.get_manifest(repo, digest)
        assert manifest.media_type == OCI_MANIFEST
        body = json.loads(manifest.body)
        assert (body["schemaVersion"], body["mediaType"]) == (2, OCI_MANIFEST)
        assert body["layers"] == [{
            "mediaType": LAYER_TYPE, "digest": sha256_digest(archive), "size": len(archive),
            "annotations": {CRIU_CONTAINER_NAME: "main", OCI_TITLE: "main.tar",
                            CRIU_ROOTFS_IMAGE_NAME: "quay.io/app:1"}}]
        await reg.get_blob(repo, sha256_digest(archive), tmp_path / "layer.tar")
        assert (tmp_path / "layer.tar").read_bytes() == archive

        assert body["config"]["mediaType"] == CONFIG_TYPE
        await reg.get_blob(repo, body["config"]["digest"], tmp_path / "config.json")
        config = json.loads((tmp_path / "config.json").read_bytes())
        assert config["os"] == "linux"
        assert config["rootfs"] == {"type": "layers", "diff_ids": [sha256_digest(archive)]}

        annotations = dict(body["annotations"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", annotations.pop(OCI_CREATED))
        image = protocol.container_images(annotations)["main"]
        per_container = json.loads((await reg.get_manifest(repo, image)).body)
        assert per_container["annotations"][CRIO_CHECKPOINT_NAME] == "main"
        assert [layer["digest"] for layer in per_container["layers"]] == [
            sha256_digest(archive)], "CRI-O's image is the same archive, not a copy"
        assert annotations == {
            protocol.MANIFEST_CONTAINER_IMAGES: f"main={image}", CRIU_CONTAINER_NAME: "main",
            CRIU_POD_NAME: "app", CRIU_POD_NAMESPACE: NS,
            CRIU_ROOTFS_IMAGE_NAME: "quay.io/app:1",
            protocol.MANIFEST_CHECKPOINT_ID: "ck-k",
            protocol.MANIFEST_SOURCE_POD_UID: w.uid(NS, "app"),
            protocol.MANIFEST_NODE: "node-1", protocol.MANIFEST_FORMAT: FORMAT,
            protocol.MANIFEST_PROTOCOL: protocol.PROTOCOL_VERSION,
            ARCHIVE_BYTES: str(len(archive)), CONTAINERS: "main", POD: f"{NS}/app",
            DUMPER: "kubelet"}

        view = await RegistryObserver(reg).tag(artifact)
        assert isinstance(view, TagView)
        assert view.digest == digest
        assert protocol.provenance_problem(view, checkpoint_id="ck-k",
                                           source_uid=w.uid(NS, "app")) is None


async def test_kubelet_refusal_is_the_reported_capture_failure(
        tmp_path: Path, kubelet: FakeKubelet) -> None:
    """A kubelet error ends the capture as ``Failed`` with ``DumpFailed: <what>: HTTP
    <status>: <kubelet message>`` on the pod, and nothing is pushed."""
    kubelet.runtime_error = CRIU_ERROR

    def factory(patcher: PodPatcher) -> KubeletDumper:
        return KubeletDumper(settings(kubelet))

    async with open_world(tmp_path, dumpers={"node-1": factory}) as w:
        w.cluster.create_pod(NS, "app", node="node-1")
        await w.running(NS, "app")
        artifact = w.request_capture(NS, "app", "ck-k")
        await w.report(NS, "app", "Failed")
        assert w.annotations(NS, "app")[protocol.REPORT_REASON] == (
            "DumpFailed: kubelet checkpoint of default/app/main: HTTP 500: checkpointing of "
            f"default/app/main failed ({CRIU_ERROR})")
        assert await RegistryObserver(w.backend.registry).tag(artifact) is None


async def test_a_runtime_restore_is_reported_once_the_runtime_runs_the_containers(
        tmp_path: Path, kubelet: FakeKubelet) -> None:
    """Restoring a kubelet checkpoint is the runtime's job: the agent pulls no archive,
    waits until the pod's containers run, continues their processes and reports the
    digest; an artifact without checkpoint images is ``RestoreUnsupported``."""
    cgroups = tmp_path / "cgroup"
    (cgroups / "pids").mkdir(parents=True)
    (cgroups / "pids" / "cgroup.procs").write_text("")

    def factory(patcher: PodPatcher) -> KubeletDumper:
        return KubeletDumper(settings(kubelet, cgroup_root=cgroups))

    async with open_world(tmp_path, dumpers={"node-1": factory, "node-2": factory}) as w:
        w.cluster.create_pod(NS, "app", node="node-1")
        await w.running(NS, "app")
        w.request_capture(NS, "app", "ck-k")
        await w.report(NS, "app", "Pushed")
        digest = w.annotations(NS, "app")[protocol.REPORT_DIGEST]
        w.cluster.create_pod(NS, "r", node="node-2", annotations=protocol.restore_request(
            artifact=f"{w.repo}@{digest}", restore_key="m/1", checkpoint_id="ck-k",
            loader="{}"))
        await w.running(NS, "r")
        restored = w.cluster.pod(NS, "r")
        assert restored is not None
        for status in restored["status"]["containerStatuses"]:
            scope = cgroups / "pids" / "pod" / f"crio-{status['containerID'].split('://')[1]}"
            scope.mkdir(parents=True)
            (scope / "cgroup.procs").write_text("")
        await w.cluster.wait_for(
            lambda: protocol.RESTORED_FROM_DIGEST in w.annotations(NS, "r"), what="report")
        assert w.annotations(NS, "r")[protocol.RESTORED_FROM_DIGEST] == digest

        podman_like = await push_without_images(w.backend.registry, w.repo, tmp_path)
        w.cluster.create_pod(NS, "r2", node="node-2", annotations=protocol.restore_request(
            artifact=f"{w.repo}@{podman_like}", restore_key="m/2", checkpoint_id="ck-p",
            loader="{}"))
        await w.cluster.wait_for(
            lambda: protocol.RESTORE_FAILURE in w.annotations(NS, "r2"), what="failure")
        assert w.annotations(NS, "r2")[protocol.RESTORE_FAILURE].startswith(
            "RestoreUnsupported: checkpoint ")


async def push_without_images(registry: Registry, repo: str, where: Path) -> str:
    """A checkpoint in the agent's (podman's) format: no checkpoint image per container."""
    archive = tmp_archive(where)
    prov = Provenance(checkpoint_id="ck-p", source_uid="u", node="node-1", namespace=NS,
                      pod="app", format="criu-archive/v1", dumper="criu",
                      created=datetime(2026, 11, 26, tzinfo=UTC))
    pushed = await push_checkpoint(registry, repo, "ck-p", [Archive("main", archive)], prov)
    return pushed.digest


def tmp_archive(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / "podman-like.tar"
    with tarfile.open(path, "w") as tar:
        body = b"{}"
        info = tarfile.TarInfo("config.dump")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return path


@pytest.mark.parametrize(("status", "verdict"), [
    ({"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}, None),
    ({"name": "main", "state": {"running": {}}}, None),  # no container id yet
    ({"name": "main", "state": {"waiting": {
        "reason": "CreateContainerError",
        "message": "locating image with ID abc: image not known"}}},
     "CRI-O did not restore container main: CreateContainerError: locating image with ID "
     "abc: image not known"),
    ({"name": "main", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}},
     "container main exited after the restore (exit code 1, Error)"),
])
def test_the_runtimes_progress_is_read_from_the_pod_status(status: dict[str, Any],
                                                           verdict: str | None) -> None:
    assert restored_containers({"status": {"containerStatuses": [status]}}, {"main"}) == verdict


def test_containers_that_run_are_restored_with_their_ids() -> None:
    pod = {"status": {"containerStatuses": [
        {"name": "main", "image": "reg/ck@sha256:1", "containerID": "cri-o://abc",
         "state": {"running": {}}}]}}
    assert restored_containers(pod, {"main"}) == (
        Container("main", "reg/ck@sha256:1", "cri-o://abc"),)


# --- the dumper alone: credentials, TLS, kubelet answers ---------------------------------

async def test_client_certificate_alone_is_accepted_by_the_kubelet(
        tmp_path: Path, kubelet: FakeKubelet, pki: Pki) -> None:
    """Without a token, the agent's client certificate authenticates it; the archive is
    moved from the node's checkpoint directory into the capture's workdir unchanged."""
    dumper = KubeletDumper(settings(kubelet, token="", client_cert=str(pki.agent.cert),
                                    client_key=str(pki.agent.key)))
    result = await dumper.dump(dump_request(tmp_path))
    assert kubelet.calls == [Call("/checkpoint/default/app/main", AGENT_CERT_USER, "30")]
    [archive] = result.archives
    assert (archive.container, archive.image, result.format) == ("main", "quay.io/app:1",
                                                                 FORMAT)
    assert archive.path.read_bytes() == next(iter(kubelet.written.values()))
    assert list(kubelet.node_dir.iterdir()) == []


@pytest.mark.parametrize(("pod", "container", "changes", "expected"), [
    ("gone", "main", {}, "HTTP 404 (no such container, or the ContainerCheckpoint feature "
                         "is off): pod does not exist"),
    ("app", "nope", {}, "HTTP 404 (no such container, or the ContainerCheckpoint feature "
                        "is off): container nope does not exist"),
    ("app", "main", {"token": ""}, "HTTP 401 (the agent's token is not accepted): "
                                   "Unauthorized"),
    ("app", "main", {"token": "stolen"}, "HTTP 401 (the agent's token is not accepted): "
                                         "Unauthorized"),
    ("app", "main", {"token": "viewer-token"},
     f"HTTP 403 (the agent may not use nodes/checkpoint): Forbidden (user={VIEWER}, "
     "verb=create, resource=nodes, subresource=checkpoint)"),
], ids=["unknown-pod", "unknown-container", "no-credentials", "wrong-token", "forbidden"])
async def test_kubelet_refusals_are_dump_failures_with_the_kubelets_message(
        tmp_path: Path, kubelet: FakeKubelet, pod: str, container: str,
        changes: dict[str, str], expected: str) -> None:
    """404 / 401 / 403 from the kubelet are a ``DumpFailed`` naming the container, the
    status, a hint and the kubelet's own message; no archive is taken."""
    dumper = KubeletDumper(settings(kubelet, **changes))
    with pytest.raises(DumpFailed) as failed:
        await dumper.dump(dump_request(tmp_path, pod, container))
    assert str(failed.value) == f"kubelet checkpoint of default/{pod}/{container}: {expected}"
    assert len(kubelet.calls) == 1
    assert list((tmp_path / "work").iterdir()) == []


async def test_runtime_failure_keeps_the_runtimes_message(
        tmp_path: Path, kubelet: FakeKubelet) -> None:
    """A 500 (CRIU failed under the runtime) is a ``DumpFailed`` carrying the message."""
    kubelet.runtime_error = CRIU_ERROR
    with pytest.raises(DumpFailed) as failed:
        await KubeletDumper(settings(kubelet)).dump(dump_request(tmp_path))
    assert str(failed.value) == ("kubelet checkpoint of default/app/main: HTTP 500: "
                                 f"checkpointing of default/app/main failed ({CRIU_ERROR})")


@pytest.mark.parametrize("trust", ["other-ca", "system-cas"])
async def test_untrusted_kubelet_certificate_is_refused_before_any_request(
        tmp_path: Path, kubelet: FakeKubelet, pki: Pki, trust: str) -> None:
    """A kubelet whose serving certificate the CA file (or, without one, the system's
    CAs) does not vouch for is refused during the TLS handshake: a clear ``DumpFailed``,
    and no request — so no token — ever reaches it."""
    ca_file = str(pki.other.cert) if trust == "other-ca" else ""
    with pytest.raises(DumpFailed) as failed:
        await KubeletDumper(settings(kubelet, ca_file=ca_file)).dump(dump_request(tmp_path))
    trusted = f"the CA file {ca_file}" if ca_file else "the system's CAs"
    assert str(failed.value).startswith(
        "kubelet checkpoint of default/app/main: the kubelet's serving certificate is not "
        f"trusted (verified against {trusted}; set the kubelet CA): ")
    assert "certificate verify failed" in str(failed.value)
    assert kubelet.calls == []


async def test_insecure_setting_skips_the_kubelet_certificate_check(
        tmp_path: Path, kubelet: FakeKubelet) -> None:
    """``insecure`` (``--kubelet-insecure``) accepts a kubelet certificate nothing vouches
    for; the call goes through as usual."""
    result = await KubeletDumper(settings(kubelet, ca_file="", insecure=True)).dump(
        dump_request(tmp_path))
    assert [a.container for a in result.archives] == ["main"]
    assert kubelet.calls == [Call("/checkpoint/default/app/main", AGENT, "30")]


@pytest.mark.parametrize("which", ["ca-file", "client-cert"])
async def test_unusable_tls_files_are_a_clear_dump_failure(
        tmp_path: Path, kubelet: FakeKubelet, pki: Pki, which: str) -> None:
    """A CA file or client certificate that cannot be loaded is named in the
    ``DumpFailed``, not surfaced as a bare ``FileNotFoundError``/``SSLError``."""
    missing = str(tmp_path / "missing.pem")
    if which == "ca-file":
        changes, expected = {"ca_file": missing}, f"cannot use the kubelet CA file {missing!r}"
    else:  # a stranger's key does not match the agent's certificate
        changes = {"client_cert": str(pki.agent.cert), "client_key": str(pki.stranger.key)}
        expected = f"cannot use the kubelet client certificate {str(pki.agent.cert)!r}"
    with pytest.raises(DumpFailed, match=f"^{re.escape(expected)}: "):
        await KubeletDumper(settings(kubelet, **changes)).dump(dump_request(tmp_path))
    assert kubelet.calls == []


@pytest.mark.parametrize(("image_id", "base"), [
    ("127.0.0.1:5000/app@sha256:" + "a" * 64, "127.0.0.1:5000/app@sha256:" + "a" * 64),
    ("docker-pullable://quay.io/app@sha256:" + "b" * 64, "quay.io/app@sha256:" + "b" * 64),
    ("sha256:" + "c" * 64, "quay.io/app:1"),  # an image id alone names no registry
    ("", "quay.io/app:1")])
def test_the_base_image_is_recorded_by_digest_when_the_runtime_says_it(image_id: str,
                                                                       base: str) -> None:
    """A tag may move between capture and restore: CRI-O restores onto the image by ID,
    so the restoring node must pull exactly that image."""
    assert base_image(Container("main", "quay.io/app:1", "cri-o://x", image_id)) == base


@pytest.mark.parametrize(("reason", "message", "verdict"), [
    ("ErrImagePull", "layer sha256:1 should be decrypted, but we can't modify the manifest: "
     "Destination specifies a digest", None),
    ("ImagePullBackOff", 'Back-off pulling image "reg/ck@sha256:1"', None),
    ("ErrImagePull", "decrypting layer sha256:1: missing private key needed for decryption",
     "CRI-O did not restore container main: ErrImagePull: decrypting layer sha256:1: "
     "missing private key needed for decryption"),
])
def test_a_sealed_restore_waits_out_only_the_kubelets_digest_pull(
        reason: str, message: str, verdict: str | None) -> None:
    """The agent pulled the sealed image by tag and proved its digest before waiting: the
    kubelet's digest pull (which containers/image refuses to decrypt) and its back-off
    are waited past; any other pull error still fails the restore."""
    pod = {"status": {"containerStatuses": [
        {"name": "main", "state": {"waiting": {"reason": reason, "message": message}}}]}}
    assert restored_containers(pod, {"main"}, sealed=True) == verdict
    assert isinstance(restored_containers(pod, {"main"}), str)  # not sealed: a failure
