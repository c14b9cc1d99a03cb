"""The simulator answers ``kubectl get`` with the real server's table.

Invariants pinned: for the same node, pods and events, the simulator's ``Table``
(``Accept: application/json;as=Table;v=v1;g=meta.k8s.io``) has the column definitions
of the real kube-apiserver (name, type, format, priority) and the same cells (ages
aside, which both compute from their own creation times); rows carry the object's
metadata by default, the whole object or nothing as ``includeObject`` asks; a client
asking for plain JSON still gets the list; a watch asking for a table (``kubectl get -w``)
gets one-row tables, headed once. A custom resource's table (the Migration CRD's printer
columns) is the real server's too. And the real ``kubectl`` against ``cpctl sim
up``'s server prints its usual columns: ``get pods -o wide`` shows STATUS, IP and NODE,
``get nodes -o wide`` STATUS and INTERNAL-IP.

The real half is an envtest API server (``KUBEBUILDER_ASSETS``) with nothing but the
objects written here (no scheduler or kubelets: the test binds and sets status itself,
the same way on both servers).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from drivers.sim import SimCluster
from drivers.sim.nodestatus import node_object
from drivers.sim.objects import Obj
from tests.support.envtest import ADMIN_TOKEN, Envtest, find_real_cluster, running_envtest
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow

TABLE = ("application/json;as=Table;v=v1;g=meta.k8s.io,"
         "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json")
MERGE = "application/merge-patch+json"
ROOT = Path(__file__).resolve().parents[2]
KUBECTL = os.environ.get("CONTROLPLANE_TEST_KUBECTL", str(ROOT / ".venv" / "bin" / "kubectl"))

Call = Callable[..., Awaitable[Any]]


@pytest.fixture(scope="module")
def envtest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Envtest]:
    kind, where = find_real_cluster()
    if kind != "assets":
        pytest.skip(f"needs a control plane of its own (KUBEBUILDER_ASSETS): {where}")
    with running_envtest(Path(where), tmp_path_factory.mktemp("envtest")) as env:
        yield env


def _client(session: aiohttp.ClientSession, base: str, context: ssl.SSLContext | None,
            token: str) -> Call:
    async def call(method: str, path: str, body: Any = None, *, accept: str = "application/json",
                   content_type: str = "application/json") -> Any:
        async with session.request(method, base + path, json=body, ssl=context or False,
                                   headers={"Authorization": f"Bearer {token}",
                                            "Accept": accept,
                                            "Content-Type": content_type}) as response:
            out = await response.json(content_type=None)
            assert response.status < 300, (method, path, out)
            return out
    return call


def _ago(now: datetime, **delta: float) -> str:
    """A time long enough ago (10 minutes or more) that its age is printed to the minute,
    so that a second passing between the two servers' answers changes nothing."""
    return (now - timedelta(**delta)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _write_world(call: Call, now: datetime) -> None:
    """The same objects on either server: a node, a running pod with restarts on it, a
    pending pod, a terminated pod, and two events (the core/v1 kind and the new kind)."""
    node = node_object("node-1", 1, cpu="4", memory="8Gi", pods=110, now=_ago(now, hours=1))
    node["metadata"]["labels"]["node-role.kubernetes.io/worker"] = ""
    await call("POST", "/api/v1/nodes", {"metadata": node["metadata"], "spec": {}})
    await call("PATCH", "/api/v1/nodes/node-1/status", {"status": node["status"]},
               content_type=MERGE)
    await call("PATCH", "/api/v1/nodes/node-1", {"spec": {"unschedulable": True}},
               content_type=MERGE)
    pods = "/api/v1/namespaces/default/pods"
    for name in ("web", "queued", "batch"):
        await call("POST", pods, {"metadata": {"name": name}, "spec": {"containers": [
            {"name": "main", "image": "pause"}, {"name": "side", "image": "pause"}]}})
    for name in ("web", "batch"):
        await call("POST", f"{pods}/{name}/binding", {
            "metadata": {"name": name}, "target": {"kind": "Node", "name": "node-1"}})
    running = {"running": {"startedAt": _ago(now, minutes=30)}}
    await call("PATCH", f"{pods}/web/status", {"status": {
        "phase": "Running", "podIP": "10.244.1.7", "podIPs": [{"ip": "10.244.1.7"}],
        "hostIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {"name": "main", "image": "pause", "imageID": "", "ready": True,
             "restartCount": 2, "state": running,
             "lastState": {"terminated": {"exitCode": 1, "finishedAt": _ago(now, minutes=20),
                                          "startedAt": _ago(now, minutes=25)}}},
            {"name": "side", "image": "pause", "imageID": "", "ready": False,
             "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}},
        content_type=MERGE)
    await call("PATCH", f"{pods}/batch/status", {"status": {
        "phase": "Succeeded", "containerStatuses": [
            {"name": n, "image": "pause", "imageID": "", "ready": False, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                      "startedAt": _ago(now, hours=3),
                                      "finishedAt": _ago(now, hours=2)}}}
            for n in ("main", "side")]}}, content_type=MERGE)
    events = "/api/v1/namespaces/default/events"
    await call("POST", events, {
        "metadata": {"name": "web.1"}, "type": "Warning", "reason": "BackOff",
        "message": "Back-off restarting failed container side ",
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web",
                           "fieldPath": "spec.containers{side}"},
        "source": {"component": "kubelet", "host": "node-1"}, "count": 4,
        "firstTimestamp": _ago(now, minutes=200), "lastTimestamp": _ago(now, minutes=15)})
    await call("POST", events, {
        "metadata": {"name": "web.2"}, "type": "Normal", "reason": "Checkpointed",
        "message": "captured", "action": "Checkpoint",
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web"},
        "reportingComponent": "controlplane", "reportingInstance": "worker-1",
        "eventTime": (now - timedelta(hours=30)).strftime("%Y-%m-%dT%H:%M:%S.000000Z")})


_AGE = re.compile(r"^\d+s$")


def _table(body: Obj, names: set[str]) -> tuple[list[tuple[Any, ...]], dict[str, list[Any]]]:
    """Column definitions as (name, type, format, priority), and the rows of ``names``
    by name with each ``Age`` cell checked (recent) and set aside."""
    columns = body["columnDefinitions"]
    assert (body["kind"], body["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    name_at = next(i for i, c in enumerate(columns) if c["name"] == "Name")
    ages = [i for i, c in enumerate(columns) if c["name"] == "Age"]
    rows: dict[str, list[Any]] = {}
    for row in body["rows"]:
        cells = list(row["cells"])
        if cells[name_at] not in names:
            continue
        for i in ages:
            assert _AGE.match(cells[i]), cells
            cells[i] = "age"
        rows[cells[name_at]] = [cells, row.get("conditions")]
    return [(c["name"], c["type"], c["format"], c["priority"]) for c in columns], rows


async def _tables(call: Call) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for what, path, names in (
            ("pods", "/api/v1/namespaces/default/pods", {"web", "queued", "batch"}),
            ("pod", "/api/v1/namespaces/default/pods/web", {"web"}),
            ("nodes", "/api/v1/nodes", {"node-1"}),
            ("events", "/api/v1/namespaces/default/events", {"web.1", "web.2"})):
        out[what] = _table(await call("GET", path, accept=TABLE), names)
    return out


async def test_the_simulators_tables_are_the_real_servers(envtest: Envtest) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with SimCluster(kubelets=False) as sim:
            call = _client(session, sim.url, None, "sim")
            await _write_world(call, now)
            simulated = await _tables(call)
            plain = await call("GET", "/api/v1/namespaces/default/pods")
            full = await call("GET", "/api/v1/namespaces/default/pods?includeObject=Object",
                              accept=TABLE)
            bare = await call("GET", "/api/v1/nodes?includeObject=None", accept=TABLE)
        context = ssl.create_default_context(cafile=str(envtest.ca_file))
        call = _client(session, envtest.server, context, ADMIN_TOKEN)
        await _write_world(call, now)
        real = await _tables(call)

    for what in ("pods", "pod", "nodes", "events"):
        assert simulated[what][0] == real[what][0], what
        assert simulated[what][1] == real[what][1], what
    # What the comparison covers (so that it cannot pass on empty tables):
    pods = simulated["pods"][1]
    assert pods["web"][0][1:4] == ["1/2", "CrashLoopBackOff", "2 (20m ago)"]
    assert pods["web"][0][5:7] == ["10.244.1.7", "node-1"]
    assert pods["queued"][0][2:7] == ["Pending", "0", "age", "<none>", "<none>"]
    assert pods["batch"][1] == [{"type": "Completed", "status": "True", "reason": "Succeeded",
                                 "message": "The pod has completed successfully."}]
    assert simulated["nodes"][1]["node-1"][0][1:3] == ["Ready,SchedulingDisabled", "worker"]
    assert simulated["events"][1]["web.1"][0][:7] == [
        "15m", "Warning", "BackOff", "pod/web", "spec.containers{side}", "kubelet, node-1",
        "Back-off restarting failed container side"]
    assert simulated["events"][1]["web.2"][0][5] == "controlplane, worker-1"

    assert plain["kind"] == "PodList"
    assert {r["object"]["kind"] for r in full["rows"]} == {"Pod"}
    assert [r["object"] for r in bare["rows"]] == [None]


async def _kubectl(kubeconfig: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", str(kubeconfig), *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


def _columns(text: str) -> list[dict[str, str]]:
    """kubectl's table as dicts: a header's words are separated by 2+ spaces."""
    header, *lines = text.splitlines()
    starts = [m.start() for m in re.finditer(r"(?:(?<=\s\s)|^)\S", header)]
    names = [header[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
    return [{n: line[s:e].strip() for n, s, e in
             zip(names, starts, [*starts[1:], None], strict=True)} for line in lines]


async def test_kubectl_get_wide_against_the_simulator_shows_node_and_status(
        tmp_path: Path) -> None:
    async with SimCluster(nodes=2) as sim:
        kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
        sim.create_pod("default", "web", node="node-2")
        sim.create_pod("default", "stuck", node="node-9")
        sim.settle()
        pods = _columns(await _kubectl(kubeconfig, "get", "pods", "-o", "wide"))
        nodes = _columns(await _kubectl(kubeconfig, "get", "nodes", "-o", "wide"))
        narrow = await _kubectl(kubeconfig, "get", "pods")
        ip = sim.pod("default", "web")["status"]["podIP"]  # type: ignore[index]

    by_name = {p["NAME"]: p for p in pods}
    assert (by_name["web"]["STATUS"], by_name["web"]["READY"]) == ("Running", "1/1")
    assert (by_name["web"]["NODE"], by_name["web"]["IP"]) == ("node-2", ip)
    assert (by_name["stuck"]["STATUS"], by_name["stuck"]["NODE"]) == ("Pending", "<none>")
    assert list(pods[0]) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE",
                             "NOMINATED NODE", "READINESS GATES"]
    assert narrow.splitlines()[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert [(n["NAME"], n["STATUS"], n["INTERNAL-IP"]) for n in nodes] == [
        ("node-1", "Ready", "10.0.0.1"), ("node-2", "Ready", "10.0.0.2")]


def _migration_crd() -> Obj:
    import yaml
    return dict(yaml.safe_load((ROOT / "deploy" / "base" / "crds" / "migration.yaml")
                               .read_text()))


async def _write_migrations(call: Call) -> None:
    """A migration with a status (every printer column filled) and one without."""
    api = "/apis/checkpoint.controlplane.dev/v1alpha1/namespaces/default/migrations"
    for name in ("done", "asked"):
        await call("POST", api, {
            "apiVersion": "checkpoint.controlplane.dev/v1alpha1", "kind": "Migration",
            "metadata": {"name": name}, "spec": {"podName": "web", "targetNodeName": "node-2"}})
    await call("PATCH", f"{api}/done/status", {"status": {
        "phase": "Succeeded", "pod": "default/web",
        "checkpoint": {"artifact": "localhost:5000/ckpt:default.web.1"}}},
        content_type=MERGE)


async def test_a_custom_resources_table_is_the_real_servers(envtest: Envtest) -> None:
    """The CRD's printer columns, as the real server's table convertor fills them."""
    crd = _migration_crd()
    path = "/apis/checkpoint.controlplane.dev/v1alpha1/namespaces/default/migrations"

    async def table(call: Call) -> tuple[list[tuple[Any, ...]], dict[str, list[Any]]]:
        return _table(await call("GET", path, accept=TABLE), {"done", "asked"})

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with SimCluster(kubelets=False) as sim:
            call = _client(session, sim.url, None, "sim")
            await call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            await _write_migrations(call)
            simulated = await table(call)
        context = ssl.create_default_context(cafile=str(envtest.ca_file))
        call = _client(session, envtest.server, context, ADMIN_TOKEN)
        await call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

        async def established() -> bool:
            got = await call("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                             "migrations.checkpoint.controlplane.dev")
            return any(c["type"] == "Established" and c["status"] == "True"
                       for c in (got.get("status") or {}).get("conditions") or [])
        await eventually(established, limit_seconds=30, every=0.1, what="the CRD established")
        await eventually(lambda: call("GET", path), limit_seconds=30, every=0.2,
                         what="the kind served", retry_on=(AssertionError,))
        await _write_migrations(call)
        real = await table(call)

    assert simulated == real
    assert simulated[1]["done"][0][1:5] == ["web", "node-2", "Succeeded", "default/web"]
    assert simulated[1]["asked"][0][3:6] == [None, None, None]


async def test_a_watch_asking_for_a_table_gets_rows_headed_once() -> None:
    """``kubectl get -w``: each event a one-row table, the columns on the first only."""
    async with SimCluster(nodes=1) as sim, aiohttp.ClientSession() as http:
        sim.create_pod("default", "a", node="node-1")
        sim.settle()
        async with http.get(f"{sim.url}/api/v1/namespaces/default/pods?watch=1",
                            headers={"Accept": TABLE}) as response:
            first = json.loads(await response.content.readline())
            sim.set_marker("default", "a", "moved")
            second = json.loads(await response.content.readline())
    assert (first["type"], first["object"]["kind"]) == ("ADDED", "Table")
    assert [c["name"] for c in first["object"]["columnDefinitions"]][:3] == [
        "Name", "Ready", "Status"]
    assert first["object"]["rows"][0]["cells"][:3] == ["a", "1/1", "Running"]
    assert (second["type"], second["object"]["columnDefinitions"]) == ("MODIFIED", None)
    assert second["object"]["rows"][0]["object"]["metadata"]["annotations"] == {
        "sim.controlplane.dev/marker": "moved"}
