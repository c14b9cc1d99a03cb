"""The simulator's fault hooks for reliability campaigns: rates, latency, storms, RBAC, drops.

Invariants pinned: a seeded error rate fails the same requests every time and about the
asked share of them; latency adds its seconds plus seeded jitter; a conflict storm hits
only writes to its object (or resource), for its count or until its window ends on the
faults' clock; a forbidden request gets the real API server's RBAC message; a watch drop
rate ends streams after events; ``--fault`` specs parse into exactly these rules, and a
bad spec is refused with a message naming the bad part.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import aiohttp
import pytest

from drivers.sim import SimCluster
from drivers.sim.faults import Faults, Request
from drivers.sim.faultspec import parse
from drivers.sim.store import Store
from drivers.sim.watch import WatchHub


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _faults(seed: int = 0, clock: FakeClock | None = None) -> Faults:
    store = Store()
    return Faults(store, WatchHub(store, bookmark_seconds=30), seed=seed,
                  clock=clock or FakeClock())


def _codes(faults: Faults, requests: list[Request]) -> list[int]:
    out = []
    for request in requests:
        hit = faults.take(request)
        out.append(0 if hit.error is None else hit.error.code)
    return out


GETS = [Request("get", "pods", "default", f"p{i}") for i in range(400)]


def test_a_seeded_error_rate_fails_the_same_requests_every_time() -> None:
    runs = []
    for _ in range(2):
        faults = _faults(seed=42)
        faults.error_rate("get", 0.25, code=503)
        runs.append(_codes(faults, GETS))
    assert runs[0] == runs[1]
    assert set(runs[0]) == {0, 503}
    assert 60 <= runs[0].count(503) <= 140  # about a quarter of 400
    other = _faults(seed=43)
    other.error_rate("get", 0.25, code=503)
    assert _codes(other, GETS) != runs[0]


def test_an_error_rate_hits_only_its_verbs_and_resource() -> None:
    faults = _faults()
    faults.error_rate(("patch", "delete"), 1.0, code=500, resource="pods")
    assert _codes(faults, [Request("patch", "pods", "a", "x"), Request("delete", "pods", "a", "x"),
                           Request("get", "pods", "a", "x"), Request("patch", "nodes", None, "n"),
                           ]) == [500, 500, 0, 0]
    assert faults.injected["error 500"] == 2


def test_latency_adds_its_seconds_and_seeded_jitter() -> None:
    delays = []
    for _ in range(2):
        faults = _faults(seed=7)
        faults.latency("*", 0.5, jitter=0.25)
        delays.append([faults.take(r).delay for r in GETS[:20]])
    assert delays[0] == delays[1]
    assert all(0.5 <= d <= 0.75 for d in delays[0])
    assert len(set(delays[0])) > 1


def test_latency_and_an_error_apply_to_the_same_request() -> None:
    faults = _faults()
    faults.latency("get", 0.1)
    faults.fail_next("get", code=500)
    hit = faults.take(GETS[0])
    assert hit.delay == 0.1
    assert hit.error is not None
    assert hit.error.code == 500
    assert faults.take(GETS[1]).error is None  # the one-shot error is used up


def test_a_conflict_storm_by_count_hits_only_writes_to_its_object() -> None:
    faults = _faults()
    faults.conflict_storm("pods", namespace="default", name="hot", times=3)
    hot = [Request(v, "pods", "default", "hot") for v in ("patch", "update", "delete", "patch")]
    assert _codes(faults, [Request("get", "pods", "default", "hot"),
                           Request("patch", "pods", "default", "cold"),
                           Request("patch", "pods", "other", "hot"), *hot]) == [
        0, 0, 0, 409, 409, 409, 0]
    assert faults.rules == []


def test_a_conflict_storm_by_window_ends_when_its_time_is_up() -> None:
    clock = FakeClock()
    faults = _faults(clock=clock)
    faults.conflict_storm("pods", seconds=30)
    patch = Request("patch", "pods", "default", "any")
    hit = faults.take(patch)
    assert hit.error is not None
    assert (hit.error.code, hit.error.reason) == (409, "Conflict")
    assert hit.error.message == ('Operation cannot be fulfilled on pods "any": the object has '
                                 "been modified; please apply your changes to the latest "
                                 "version and try again")
    clock.now += 29.9
    assert faults.take(patch).error is not None
    clock.now += 0.1
    assert faults.take(patch).error is None
    assert faults.rules == []


def test_a_storm_needs_a_count_or_a_window() -> None:
    with pytest.raises(ValueError, match="times= or seconds="):
        _faults().conflict_storm("pods")


def test_a_forbidden_request_gets_the_real_rbac_message() -> None:
    faults = _faults()
    faults.forbid("delete", "pods", namespace="shop")
    faults.forbid("list", "nodes")
    delete = faults.take(Request("delete", "pods", "shop", "web-0")).error
    nodes = faults.take(Request("list", "nodes")).error
    assert delete is not None
    assert nodes is not None
    assert delete.message == ('pods "web-0" is forbidden: User "system:serviceaccount:default:'
                              'controlplane" cannot delete resource "pods" in API group "" in '
                              'the namespace "shop"')
    assert delete.details == {"kind": "pods", "name": "web-0"}
    assert nodes.message.endswith('cannot list resource "nodes" in API group "" at the '
                                  "cluster scope")
    assert faults.take(Request("delete", "pods", "other", "web-0")).error is None


def test_a_rate_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="probability"):
        _faults().error_rate("get", 1.5)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def test_the_server_answers_injected_faults_as_status_objects(
        sim: SimCluster, session: aiohttp.ClientSession) -> None:
    sim.create_pod("default", "web")
    sim.faults.forbid("delete", "pods")
    sim.faults.conflict_storm("pods", name="web", times=1)
    base = f"{sim.url}/api/v1/namespaces/default/pods/web"
    async with session.delete(base) as r:
        assert r.status == 403
        body = await r.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "Forbidden", 403)
    assert 'cannot delete resource "pods"' in body["message"]
    async with session.patch(base, data=json.dumps({"metadata": {"labels": {"a": "b"}}}),
                             headers={"Content-Type": "application/merge-patch+json"}) as r:
        assert r.status == 409
        assert (await r.json())["reason"] == "Conflict"
    async with session.get(base) as r:
        assert r.status == 200


async def test_a_watch_drop_rate_ends_streams_after_events(
        sim: SimCluster, session: aiohttp.ClientSession) -> None:
    sim.create_pod("default", "a")
    sim.create_pod("default", "b")
    sim.faults.drop_watch_rate(1.0)
    events = []
    async with session.get(f"{sim.url}/api/v1/pods?watch=1") as r:
        async for line in r.content:  # ends when the server ends the stream
            events.append(json.loads(line))
    assert [e["type"] for e in events] == ["ADDED"]
    assert sim.faults.injected["watch drop"] == 1


def test_fault_specs_parse_into_the_hooks_they_name() -> None:
    faults = _faults()
    for text in ("error,verb=patch+delete,rate=0.1,code=503,resource=pods",
                 "latency,seconds=0.05,jitter=0.02",
                 "drop-watches,rate=0.01,abrupt=true",
                 "conflicts,resource=pods,name=app,times=5",
                 "forbid,verb=delete,resource=pods,namespace=shop"):
        parse(text).install(faults)
    error, latency, storm, forbid = faults.rules
    assert (error.verbs, error.rate, error.code, error.resource) == (
        ("patch", "delete"), 0.1, 503, "pods")
    assert (latency.verbs, latency.delay, latency.jitter) == (("*",), 0.05, 0.02)
    assert (storm.name, storm.remaining, storm.code) == ("app", 5, 409)
    assert (forbid.verbs, forbid.namespace, forbid.code) == (("delete",), "shop", 403)
    assert faults.watch_drop == (0.01, True)


@pytest.mark.parametrize(("text", "says"), [
    ("explode", "unknown fault kind 'explode'"),
    ("error,rate=2", "probability"),
    ("error,verb=pach,rate=0.1", "unknown verb 'pach'"),
    ("latency", "latency faults need seconds"),
    ("latency,seconds=soon", "seconds='soon'"),
    ("conflicts,name=x", "times= or seconds="),
    ("forbid,verb=get,resource=pods,user=x", "not 'user'"),
    ("drop-watches,rate", "is not key=value"),
])
def test_a_bad_fault_spec_is_refused_naming_the_bad_part(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse(text)
