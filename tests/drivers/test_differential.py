"""The simulator against a real kube-apiserver: the same raw requests, the same answers.

Each case is a short script of raw HTTP requests (aiohttp, not the driver) that ends in
one :class:`Answer`: the status code and the Status ``reason`` (or, for a success, the
kind answered; for a watch, its first event), plus whatever else the case pins (a message
fragment, ``details``, what a later GET sees). Each case runs on a fresh
``SimCluster(kubelets=False)`` and on a kube-apiserver v1.36 started the envtest way for
this module (no nodes, no kubelets: pods stay unscheduled on both), each in its own
namespace. The real server is the judge: a case that answers differently is a simulator
bug, unless it is in :data:`KNOWN_DIFFERENCES` (case -> why), where it must STILL
differ, so that a fix is noticed and the entry removed. ``docs/simulator.md`` lists the
table ("Differences from the real API server"); set ``DIFFERENTIAL_TABLE=path`` to have
this module write it as markdown.

Skipped, with the line that says how to enable it, without a real server; and with
only ``CONTROLPLANE_TEST_KUBECONFIG``, since the compaction cases compact the envtest
etcd directly.
"""

from __future__ import annotations

import json
import os
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from drivers.sim import SimCluster
from drivers.sim.faultproxy import SSL_CLOSE_LEAKS
from tests.support.envtest import (
    ADMIN_TOKEN,
    ASSETS,
    Envtest,
    find_real_cluster,
    running_envtest,
)

JSON = "application/json"
MERGE = "application/merge-patch+json"
SMP = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
OTHER_UID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Answer:
    """What a case compares: ``code`` and ``reason`` (the Status reason, else the kind
    answered, else a watch's first event), and ``extra``: anything else the case pins."""

    code: int
    reason: str
    extra: Any = None

    def __str__(self) -> str:
        text = f"{self.code} {self.reason or '(no reason)'}"
        return text if self.extra is None else f"{text} {json.dumps(self.extra)}"


@dataclass
class Api:
    """Raw HTTP to one server, in one namespace of the case's own."""

    base: str
    session: aiohttp.ClientSession
    ns: str
    compact: Callable[[], Awaitable[None]]
    tls: ssl.SSLContext | None = None
    bodies: list[Any] = field(default_factory=list)

    async def call(self, method: str, path: str, body: Any = None, *,
                   content_type: str = JSON) -> tuple[Answer, Any]:
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.base + path, data=data, ssl=self.tls,
                                        headers={"Content-Type": content_type}) as r:
            raw = await r.read()
        parsed = json.loads(raw) if raw else None
        return Answer(r.status, _reason(parsed)), parsed

    async def watch(self, path: str) -> Answer:
        """The watch's first event (``ERROR`` with its Status code and reason), or its
        HTTP refusal; ``timeoutSeconds`` in ``path`` bounds the wait on both servers."""
        async with self.session.get(self.base + path, ssl=self.tls) as r:
            if r.status != 200:
                return Answer(r.status, _reason(json.loads(await r.read())))
            line = await r.content.readline()
        if not line:
            return Answer(200, "(ended without an event)")
        event = json.loads(line)
        if event["type"] == "ERROR":
            status = event["object"]
            return Answer(200, f"ERROR {status.get('code')} {status.get('reason', '')}")
        return Answer(200, str(event["type"]))

    def pods(self, name: str = "") -> str:
        return f"/api/v1/namespaces/{self.ns}/pods" + (f"/{name}" if name else "")

    async def make_pod(self, name: str, **metadata: Any) -> Any:
        answer, body = await self.call("POST", self.pods(), pod(name, **metadata))
        assert answer.code == 201, (answer, body)
        return body


def _reason(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    if body.get("kind") == "Status":
        return str(body.get("reason") or ("" if body.get("status") != "Success" else "Success"))
    return str(body.get("kind") or "")


def pod(name: str, **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **metadata},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}]}}


def eviction(name: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}, **extra}


def binding(name: str, node: str = "node-1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"kind": "Node", "name": node}}


def _causes(body: Any) -> list[tuple[str, str]]:
    """The (field, reason) of each cause, once: kube-apiserver may repeat a cause (a
    changed ``metadata.uid`` is reported twice), which no client can depend on."""
    return sorted({(str(c.get("field", "")), str(c.get("reason", "")))
                   for c in (body.get("details") or {}).get("causes") or []})


# --- the cases ------------------------------------------------------------------------------

Case = Callable[[Api], Awaitable[Answer]]
CASES: dict[str, Case] = {}


def case(fn: Case) -> Case:
    CASES[fn.__name__.replace("_", "-")] = fn
    return fn


@case
async def create_pod(api: Api) -> Answer:
    answer, body = await api.call("POST", api.pods(), pod("web"))
    return Answer(answer.code, answer.reason, body["metadata"]["name"])


@case
async def create_pod_twice(api: Api) -> Answer:
    await api.make_pod("web")
    return (await api.call("POST", api.pods(), pod("web")))[0]


@case
async def get_pod(api: Api) -> Answer:
    await api.make_pod("web")
    answer, body = await api.call("GET", api.pods("web"))
    return Answer(answer.code, answer.reason, body["status"]["phase"])


@case
async def get_missing_pod(api: Api) -> Answer:
    answer, body = await api.call("GET", api.pods("nobody"))
    return Answer(answer.code, answer.reason, body["details"])


@case
async def list_by_label_selector(api: Api) -> Answer:
    await api.make_pod("a", labels={"app": "shop", "tier": "web"})
    await api.make_pod("b", labels={"app": "shop", "tier": "db"})
    await api.make_pod("c", labels={"app": "blog"})
    answer, body = await api.call("GET", api.pods() + "?labelSelector=app%3Dshop,tier!%3Ddb")
    return Answer(answer.code, answer.reason, [p["metadata"]["name"] for p in body["items"]])


@case
async def list_by_field_selector(api: Api) -> Answer:
    await api.make_pod("a")
    await api.make_pod("b")
    answer, body = await api.call("GET", api.pods() + "?fieldSelector=metadata.name%3Db,"
                                  "status.phase%3DPending,spec.nodeName%3D")
    return Answer(answer.code, answer.reason, [p["metadata"]["name"] for p in body["items"]])


@case
async def list_by_unknown_field(api: Api) -> Answer:
    return (await api.call("GET", api.pods() + "?fieldSelector=spec.image%3Dx"))[0]


@case
async def watch_from_a_version_with_bookmarks(api: Api) -> Answer:
    created = await api.make_pod("web")
    await api.call("PATCH", api.pods("web"), {"metadata": {"labels": {"a": "1"}}},
                   content_type=MERGE)
    version = created["metadata"]["resourceVersion"]
    return await api.watch(api.pods() + f"?watch=1&resourceVersion={version}"
                           "&allowWatchBookmarks=true&timeoutSeconds=2")


@case
async def merge_patch_annotations(api: Api) -> Answer:
    await api.make_pod("web", annotations={"keep": "1", "drop": "1"})
    answer, body = await api.call("PATCH", api.pods("web"), {"metadata": {"annotations": {
        "drop": None, "add": "2"}}}, content_type=MERGE)
    return Answer(answer.code, answer.reason, body["metadata"]["annotations"])


@case
async def strategic_merge_patch_annotations_with_uid(api: Api) -> Answer:
    made = await api.make_pod("web", annotations={"keep": "1", "drop": "1"})
    answer, body = await api.call("PATCH", api.pods("web"), {"metadata": {
        "uid": made["metadata"]["uid"], "annotations": {"drop": None, "add": "2"}}},
        content_type=SMP)
    return Answer(answer.code, answer.reason, body["metadata"]["annotations"])


@case
async def strategic_merge_patch_with_another_uid(api: Api) -> Answer:
    await api.make_pod("web")
    answer, body = await api.call("PATCH", api.pods("web"), {"metadata": {
        "uid": OTHER_UID, "annotations": {"add": "2"}}}, content_type=SMP)
    return Answer(answer.code, answer.reason, _causes(body))


@case
async def json_patch_annotations(api: Api) -> Answer:
    await api.make_pod("web", annotations={"keep": "1"})
    answer, body = await api.call("PATCH", api.pods("web"), [
        {"op": "test", "path": "/metadata/annotations/keep", "value": "1"},
        {"op": "add", "path": "/metadata/annotations/add", "value": "2"}],
        content_type=JSON_PATCH)
    return Answer(answer.code, answer.reason, body["metadata"]["annotations"])


@case
async def json_patch_failed_test(api: Api) -> Answer:
    await api.make_pod("web", annotations={"keep": "1"})
    return (await api.call("PATCH", api.pods("web"), [
        {"op": "test", "path": "/metadata/annotations/keep", "value": "2"},
        {"op": "add", "path": "/metadata/annotations/add", "value": "2"}],
        content_type=JSON_PATCH))[0]


@case
async def delete_with_matching_uid(api: Api) -> Answer:
    made = await api.make_pod("web")
    answer, _ = await api.call("DELETE", api.pods("web"), {
        "preconditions": {"uid": made["metadata"]["uid"]}})
    after, _ = await api.call("GET", api.pods("web"))
    return Answer(answer.code, answer.reason, after.code)


@case
async def delete_with_another_uid(api: Api) -> Answer:
    made = await api.make_pod("web")
    answer, body = await api.call("DELETE", api.pods("web"), {
        "preconditions": {"uid": OTHER_UID}})
    expected = (f'Operation cannot be fulfilled on Pod "web": the UID in the precondition '
                f"({OTHER_UID}) does not match the UID in record ({made['metadata']['uid']}). "
                "The object might have been deleted and then recreated")
    return Answer(answer.code, answer.reason, [body["message"] == expected, body["details"]])


@case
async def delete_with_a_stale_resource_version(api: Api) -> Answer:
    made = await api.make_pod("web")
    _, patched = await api.call("PATCH", api.pods("web"), {"metadata": {"labels": {"a": "1"}}},
                                content_type=MERGE)
    answer, body = await api.call("DELETE", api.pods("web"), {
        "preconditions": {"resourceVersion": made["metadata"]["resourceVersion"]}})
    expected = (f'Operation cannot be fulfilled on Pod "web": the ResourceVersion in the '
                f"precondition ({made['metadata']['resourceVersion']}) does not match the "
                f"ResourceVersion in record ({patched['metadata']['resourceVersion']}). The "
                "object might have been modified")
    return Answer(answer.code, answer.reason, [body["message"] == expected, body["details"]])


@case
async def delete_with_the_current_resource_version(api: Api) -> Answer:
    made = await api.make_pod("web")
    return (await api.call("DELETE", api.pods("web"), {
        "preconditions": {"resourceVersion": made["metadata"]["resourceVersion"]}}))[0]


def _event(api: Api, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
            "involvedObject": {"kind": "Pod", "name": "web", "namespace": api.ns},
            "reason": "Migrated", "message": "moved", "type": "Normal",
            "source": {"component": "checkpoint-controlplane"}}


@case
async def create_event(api: Api) -> Answer:
    answer, body = await api.call("POST", f"/api/v1/namespaces/{api.ns}/events",
                                  _event(api, "web.0123456789abcdef"))
    return Answer(answer.code, answer.reason, body["reason"])


@case
async def create_event_twice(api: Api) -> Answer:
    await api.call("POST", f"/api/v1/namespaces/{api.ns}/events", _event(api, "web.x"))
    return (await api.call("POST", f"/api/v1/namespaces/{api.ns}/events",
                           _event(api, "web.x")))[0]


@case
async def patch_node_unschedulable(api: Api) -> Answer:
    node = f"{api.ns}-node"
    made, _ = await api.call("POST", "/api/v1/nodes", {"metadata": {"name": node}})
    assert made.code == 201
    answer, body = await api.call("PATCH", f"/api/v1/nodes/{node}",
                                  {"spec": {"unschedulable": True}}, content_type=SMP)
    return Answer(answer.code, answer.reason, body["spec"].get("unschedulable"))


@case
async def patch_pod_status(api: Api) -> Answer:
    await api.make_pod("web")
    answer, body = await api.call("PATCH", api.pods("web") + "/status", {"status": {
        "conditions": [{"type": "Ready", "status": "False", "reason": "Checkpointing"}]},
        "metadata": {"labels": {"ignored": "1"}}}, content_type=SMP)
    return Answer(answer.code, answer.reason,
                  [[c["type"], c["reason"]] for c in body["status"]["conditions"]]
                  + [body["metadata"].get("labels")])


@case
async def name_over_253_characters(api: Api) -> Answer:
    answer, body = await api.call("POST", api.pods(), pod("a" * 254))
    return Answer(answer.code, answer.reason, [_causes(body), "no more than 253 characters"
                                               in body["message"]])


@case
async def bad_annotation_key(api: Api) -> Answer:
    answer, body = await api.call("POST", api.pods(), pod("web", annotations={"bad key!": "v"}))
    return Answer(answer.code, answer.reason, _causes(body))


@case
async def annotations_over_256_kib(api: Api) -> Answer:
    answer, body = await api.call("POST", api.pods(), pod("web", annotations={
        "a": "x" * (128 * 1024), "b": "x" * (128 * 1024)}))
    return Answer(answer.code, answer.reason, _causes(body))


@case
async def label_value_over_63_characters(api: Api) -> Answer:
    answer, body = await api.call("POST", api.pods(), pod("web", labels={"app": "x" * 64}))
    return Answer(answer.code, answer.reason, _causes(body))


@case
async def strict_create_with_an_unknown_field(api: Api) -> Answer:
    body = pod("web")
    body["spec"]["containers"][0]["imagePolicy"] = "Always"
    answer, out = await api.call("POST", api.pods() + "?fieldValidation=Strict", body)
    return Answer(answer.code, answer.reason,
                  'strict decoding error: unknown field "spec.containers[0].imagePolicy"'
                  in out["message"])


@case
async def strict_patch_with_an_unknown_field(api: Api) -> Answer:
    await api.make_pod("web")
    answer, body = await api.call("PATCH", api.pods("web") + "?fieldValidation=Strict",
                                  {"metadata": {"annotation": {"a": "1"}}}, content_type=MERGE)
    return Answer(answer.code, answer.reason, [_causes(body), 'unknown field '
                                               '"metadata.annotation"' in body["message"]])


@case
async def watch_from_a_compacted_version(api: Api) -> Answer:
    # Events, not pods: the envtest server keeps no watch cache for events, so the watch
    # reaches etcd, whose compaction it meets (a watch cache would still serve it).
    events = f"/api/v1/namespaces/{api.ns}/events"
    _, first = await api.call("POST", events, _event(api, "web.1"))
    for later in ("web.2", "web.3", "web.4"):  # etcd keeps the revision compacted at
        await api.call("POST", events, _event(api, later))
    await api.compact()
    return await api.watch(events + "?watch=1&timeoutSeconds=2&resourceVersion="
                           + first["metadata"]["resourceVersion"])


@case
async def list_at_a_compacted_version_exactly(api: Api) -> Answer:
    events = f"/api/v1/namespaces/{api.ns}/events"
    _, first = await api.call("POST", events, _event(api, "web.1"))
    await api.call("POST", events, _event(api, "web.2"))
    await api.compact()
    return (await api.call("GET", events + "?resourceVersionMatch=Exact&resourceVersion="
                           + first["metadata"]["resourceVersion"]))[0]


@case
async def list_with_an_invalid_resource_version(api: Api) -> Answer:
    return (await api.call("GET", api.pods() + "?resourceVersion=abc"))[0]


@case
async def watch_with_an_invalid_resource_version(api: Api) -> Answer:
    return await api.watch(api.pods() + "?watch=1&resourceVersion=abc&timeoutSeconds=1")


@case
async def patch_node_name(api: Api) -> Answer:
    await api.make_pod("web")
    answer, body = await api.call("PATCH", api.pods("web"), {"spec": {"nodeName": "node-1"}},
                                  content_type=SMP)
    return Answer(answer.code, answer.reason, _causes(body))


@case
async def bind_pod(api: Api) -> Answer:
    await api.make_pod("web")
    answer, _ = await api.call("POST", api.pods("web") + "/binding", binding("web"))
    _, after = await api.call("GET", api.pods("web"))
    return Answer(answer.code, answer.reason, after["spec"].get("nodeName"))


@case
async def bind_a_bound_pod(api: Api) -> Answer:
    await api.make_pod("web")
    await api.call("POST", api.pods("web") + "/binding", binding("web"))
    answer, body = await api.call("POST", api.pods("web") + "/binding", binding("web", "node-2"))
    return Answer(answer.code, answer.reason, body.get("details"))


@case
async def bind_a_missing_pod(api: Api) -> Answer:
    return (await api.call("POST", api.pods("nobody") + "/binding", binding("nobody")))[0]


@case
async def evict_pod(api: Api) -> Answer:
    await api.make_pod("web")
    answer, _ = await api.call("POST", api.pods("web") + "/eviction", eviction("web"))
    after, _ = await api.call("GET", api.pods("web"))
    return Answer(answer.code, answer.reason, after.code)


@case
async def evict_a_missing_pod(api: Api) -> Answer:
    return (await api.call("POST", api.pods("nobody") + "/eviction", eviction("nobody")))[0]


@case
async def evict_with_another_name(api: Api) -> Answer:
    await api.make_pod("web")
    return (await api.call("POST", api.pods("web") + "/eviction", eviction("other")))[0]


@case
async def dry_run_create(api: Api) -> Answer:
    answer, body = await api.call("POST", api.pods() + "?dryRun=All", pod("web"))
    after, _ = await api.call("GET", api.pods("web"))
    return Answer(answer.code, answer.reason,
                  ["resourceVersion" in body["metadata"], bool(body["metadata"].get("uid")),
                   after.code])


@case
async def dry_run_create_invalid(api: Api) -> Answer:
    return (await api.call("POST", api.pods() + "?dryRun=All", pod("Web")))[0]


@case
async def dry_run_patch(api: Api) -> Answer:
    made = await api.make_pod("web")
    answer, body = await api.call("PATCH", api.pods("web") + "?dryRun=All",
                                  {"metadata": {"annotations": {"a": "1"}}}, content_type=MERGE)
    _, after = await api.call("GET", api.pods("web"))
    return Answer(answer.code, answer.reason, [
        body["metadata"].get("annotations"),
        body["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"],
        after["metadata"].get("annotations")])


@case
async def dry_run_delete(api: Api) -> Answer:
    await api.make_pod("web")
    answer, _ = await api.call("DELETE", api.pods("web") + "?dryRun=All")
    after, _ = await api.call("GET", api.pods("web"))
    return Answer(answer.code, answer.reason, after.code)


@case
async def dry_run_unsupported_value(api: Api) -> Answer:
    answer, body = await api.call("POST", api.pods() + "?dryRun=Everything", pod("web"))
    return Answer(answer.code, answer.reason, [body["details"]["kind"], _causes(body)])


#: case -> why the simulator answers differently on purpose; asserted to still differ.
GATE = "checkpoint.controlplane.dev/restore"
HOST_TERM = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                   "values": ["node-2"]}]}


def _required(*terms: Any) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}


async def _gated(api: Api, name: str, affinity: Any = None) -> None:
    body = pod(name)
    body["spec"]["schedulingGates"] = [{"name": GATE}]
    if affinity is not None:
        body["spec"]["affinity"] = affinity
    answer, created = await api.call("POST", api.pods(), body)
    assert answer.code == 201, (answer, created)


@case
async def gated_pod_gets_node_affinity_and_loses_its_gate(api: Api) -> Answer:
    """KEP-3838: how a migration claims a StatefulSet's gated successor."""
    await _gated(api, "web-1")
    answer, body = await api.call("PATCH", api.pods("web-1"), {
        "metadata": {"annotations": {"claimed": "yes"}},
        "spec": {"affinity": _required(HOST_TERM), "schedulingGates": []}},
        content_type=MERGE)
    spec = body.get("spec") or {}
    return Answer(answer.code, answer.reason, [spec.get("schedulingGates"), spec.get(
        "affinity")])


@case
async def gated_pod_required_terms_may_only_be_extended(api: Api) -> Answer:
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    await _gated(api, "web-1", _required(zone))
    extended = {"matchExpressions": [*zone["matchExpressions"],
                                     *HOST_TERM["matchExpressions"]]}
    ok, _ = await api.call("PATCH", api.pods("web-1"), {
        "spec": {"affinity": _required(extended)}}, content_type=MERGE)
    refused, body = await api.call("PATCH", api.pods("web-1"), {
        "spec": {"affinity": _required(HOST_TERM)}}, content_type=MERGE)
    return Answer(refused.code, refused.reason, [ok.code, _causes(body)])


@case
async def a_scheduling_gate_cannot_be_added_after_creation(api: Api) -> Answer:
    await api.make_pod("web")
    answer, body = await api.call("PATCH", api.pods("web"), {
        "spec": {"schedulingGates": [{"name": GATE}]}}, content_type=MERGE)
    return Answer(answer.code, answer.reason, _causes(body))


KNOWN_DIFFERENCES: dict[str, str] = {
    "list-at-a-compacted-version-exactly": (
        "the simulator keeps no old versions: a LIST always answers the current state and "
        "ignores resourceVersion/resourceVersionMatch (the driver lists from the current "
        "state and resumes watches, which do honour compaction)"),
}


# --- running them ---------------------------------------------------------------------------

RESULTS: dict[str, tuple[Answer, Answer]] = {}


def _namespace(case_id: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", case_id)[:60].strip("-")


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Envtest]:
    kind, where = find_real_cluster()
    if kind == "none":
        pytest.skip(where)
    assets = os.environ.get(ASSETS)
    if not assets:  # a cluster named by kubeconfig: its etcd is out of reach
        pytest.skip(f"needs {ASSETS}: the compaction cases compact the envtest etcd directly")
    # No watch cache for events, so a watch from a compacted version meets etcd's
    # compaction (see watch_from_a_compacted_version).
    with running_envtest(Path(assets), tmp_path_factory.mktemp("differential"),
                         extra_args=["--watch-cache-sizes=events#0"]) as env:
        yield env
    table = os.environ.get("DIFFERENTIAL_TABLE")
    if table:
        Path(table).write_text(markdown_table())


def markdown_table() -> str:
    rows = ["| case | real kube-apiserver | simulator | agree |", "|---|---|---|---|"]
    for case_id in CASES:
        if case_id in RESULTS:
            real, sim = RESULTS[case_id]
            same = "yes" if real == sim else "no (known)" if case_id in KNOWN_DIFFERENCES \
                else "**no**"
            rows.append(f"| `{case_id}` | {real.code} {real.reason or '(none)'} | "
                        f"{sim.code} {sim.reason or '(none)'} | {same} |")
    return "\n".join(rows) + "\n"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    # A watch read for its first event only is closed while the real server streams on:
    # its TLS shutdown must not outlive the test's loop (see SSL_CLOSE_LEAKS).
    async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30),
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            connector=aiohttp.TCPConnector(enable_cleanup_closed=SSL_CLOSE_LEAKS)) as s:
        yield s


async def _in_namespace(api: Api) -> Api:
    answer, body = await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": api.ns}})
    assert answer.code == 201, (answer, body)
    return api


@pytest.mark.parametrize("case_id", list(CASES))
async def test_the_simulator_answers_as_kube_apiserver_does(
        case_id: str, real_server: Envtest, session: aiohttp.ClientSession) -> None:
    """Pins: the (code, reason, extra) a real kube-apiserver v1.36 answers each case with
    is what the simulator answers, except the KNOWN_DIFFERENCES, which must still differ."""
    ns = _namespace(case_id)

    async def compact_etcd() -> None:
        # Compact at the current revision through etcd's gRPC gateway (no TLS, no auth).
        _, listed = await real.call("GET", "/api/v1/namespaces")
        async with aiohttp.ClientSession() as plain, plain.post(
                f"http://127.0.0.1:{real_server.etcd_port}/v3/kv/compaction",
                json={"revision": int(listed["metadata"]["resourceVersion"]),
                      "physical": True}) as r:
            assert r.status == 200, await r.text()

    tls = ssl.create_default_context(cafile=str(real_server.ca_file))
    real = await _in_namespace(Api(real_server.server, session, ns, compact_etcd, tls))
    async with SimCluster(nodes=0, kubelets=False) as sim:
        async def compact_sim() -> None:
            sim.store.compact()

        simulated = await _in_namespace(Api(sim.url, session, ns, compact_sim))
        sim_answer = await CASES[case_id](simulated)
    real_answer = await CASES[case_id](real)
    RESULTS[case_id] = (real_answer, sim_answer)
    if case_id in KNOWN_DIFFERENCES:
        assert sim_answer != real_answer, (
            f"{case_id} now agrees ({real_answer}): remove it from KNOWN_DIFFERENCES and "
            "from docs/simulator.md")
    else:
        assert sim_answer == real_answer, f"real: {real_answer}\nsimulator: {sim_answer}"
