"""The ``kubelet`` dumper against a fake kubelet: the ContainerCheckpoint API, end to end.

No real kubelet runs here, so a tiny aiohttp server plays one: ``POST
/checkpoint/{namespace}/{pod}/{container}`` writes an archive into the "node's"
checkpoint directory and answers with its kubelet-side path, as the real one does. Pins:
the agent calls it with its bearer token and a timeout, pushes that exact archive as the
artifact's layer with the CRI-O / CRIU annotations, empties the node's checkpoint
directory, and reports the kubelet's refusal as the capture failure.
"""

from __future__ import annotations

import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from controlplane.machines import protocol
from drivers.agent.kubelet import KubeletDumper, KubeletSettings
from drivers.agent.pods import PodPatcher
from drivers.registry.artifact import CRIO_CHECKPOINT_NAME, CRIU_ROOTFS_IMAGE_NAME
from drivers.registry.checkpoints import pull_checkpoint
from tests.agent.world import open_world

NS = "default"
KUBELET_DIR = "/var/lib/kubelet/checkpoints"


@dataclass
class FakeKubelet:
    node_dir: Path
    token: str = "agent-token"
    status: int = 200
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (path, auth, timeout)
    url: str = ""

    async def checkpoint(self, request: web.Request) -> web.Response:
        self.calls.append((request.path, request.headers.get("Authorization", ""),
                           request.query.get("timeout", "")))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.Response(status=401, text="Unauthorized")
        if self.status != 200:
            return web.Response(status=self.status, text="checkpointing of default/app/main "
                                "failed: running \"criu\": exit status 1")
        ns, pod, container = (request.match_info[k] for k in ("ns", "pod", "container"))
        name = f"checkpoint-{pod}_{ns}-{container}-2026-01-01T00:00:00Z.tar"
        payload = self.node_dir / "payload"
        payload.write_text(f"criu images of {ns}/{pod}/{container}")
        with tarfile.open(self.node_dir / name, "w") as tar:
            tar.add(payload, arcname="checkpoint/pages-1.img")
        payload.unlink()
        return web.json_response({"items": [f"{KUBELET_DIR}/{name}"]})


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[FakeKubelet]:
    node_dir = tmp_path / "node1-checkpoints"
    node_dir.mkdir()
    fake = FakeKubelet(node_dir)
    app = web.Application()
    app.router.add_post("/checkpoint/{ns}/{pod}/{container}", fake.checkpoint)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield fake
    await runner.cleanup()


def kubelet_dumper(fake: FakeKubelet) -> KubeletDumper:
    return KubeletDumper(KubeletSettings(url=fake.url, token=fake.token,
                                         checkpoint_dir=fake.node_dir,
                                         kubelet_checkpoint_dir=KUBELET_DIR, timeout=30))


async def test_kubelet_checkpoint_archive_is_pushed_as_a_cri_o_checkpoint_image(
        tmp_path: Path, kubelet: FakeKubelet) -> None:
    def factory(patcher: PodPatcher) -> KubeletDumper:
        return kubelet_dumper(kubelet)

    async with open_world(tmp_path, dumpers={"node-1": factory}) as w:
        w.cluster.create_pod(NS, "app", node="node-1", image="quay.io/app:1")
        await w.running(NS, "app")
        w.request_capture(NS, "app", "ck-k")
        await w.report(NS, "app", "Pushed", "Failed")
        notes = w.annotations(NS, "app")
        assert notes[protocol.REPORT_STATE] == "Pushed", notes.get(protocol.REPORT_REASON)
        assert kubelet.calls == [("/checkpoint/default/app/main", "Bearer agent-token", "30")]
        assert list(kubelet.node_dir.iterdir()) == []  # taken off the node
        pulled = await pull_checkpoint(w.backend.registry, w.repo,
                                       notes[protocol.REPORT_DIGEST], tmp_path / "pulled")
        with tarfile.open(pulled.files["main"]) as tar:
            member = tar.extractfile("checkpoint/pages-1.img")
            assert member is not None
            assert member.read() == b"criu images of default/app/main"
        a = pulled.artifact.annotations
        assert a[CRIO_CHECKPOINT_NAME] == "main"
        assert a[CRIU_ROOTFS_IMAGE_NAME] == "quay.io/app:1"
        assert a[protocol.MANIFEST_FORMAT] == "kubelet-checkpoint/v1"
        assert a[protocol.MANIFEST_SOURCE_POD_UID] == w.uid(NS, "app")


@pytest.mark.parametrize(("status", "token", "expected"), [
    (500, "agent-token", "HTTP 500: checkpointing of default/app/main failed"),
    (200, "wrong-token", "HTTP 401 (the agent's token is not accepted)"),
], ids=["runtime-failure", "unauthorized"])
async def test_kubelet_refusal_is_the_reported_capture_failure(
        tmp_path: Path, kubelet: FakeKubelet, status: int, token: str, expected: str) -> None:
    kubelet.status = status

    def factory(patcher: PodPatcher) -> KubeletDumper:
        dumper = kubelet_dumper(kubelet)
        dumper.settings = KubeletSettings(**{**dumper.settings.__dict__, "token": token})
        return dumper

    async with open_world(tmp_path, dumpers={"node-1": factory}) as w:
        w.cluster.create_pod(NS, "app", node="node-1")
        await w.running(NS, "app")
        w.request_capture(NS, "app", "ck-k")
        await w.report(NS, "app", "Failed")
        reason = w.annotations(NS, "app")[protocol.REPORT_REASON]
        assert reason.startswith("DumpFailed: kubelet checkpoint of default/app/main: ")
        assert expected in reason


async def test_the_kubelet_dumper_does_not_restore(tmp_path: Path,
                                                   kubelet: FakeKubelet) -> None:
    def factory(patcher: PodPatcher) -> KubeletDumper:
        return kubelet_dumper(kubelet)

    async with open_world(tmp_path, dumpers={"node-1": factory, "node-2": factory}) as w:
        w.cluster.create_pod(NS, "app", node="node-1")
        await w.running(NS, "app")
        w.request_capture(NS, "app", "ck-k")
        await w.report(NS, "app", "Pushed")
        digest = w.annotations(NS, "app")[protocol.REPORT_DIGEST]
        w.cluster.create_pod(NS, "r", node="node-2", annotations=protocol.restore_request(
            artifact=f"{w.repo}@{digest}", restore_key="m/1", checkpoint_id="ck-k",
            loader="{}"))
        await w.cluster.wait_for(
            lambda: protocol.RESTORE_FAILURE in w.annotations(NS, "r"), what="failure")
        assert w.annotations(NS, "r")[protocol.RESTORE_FAILURE].startswith(
            "RestoreUnsupported: ")
