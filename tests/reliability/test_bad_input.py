"""Malformed and hostile input to every CLI verb and every API endpoint is refused with a
clear message — exit 2 (or 3 for an unusable database) / HTTP 4xx naming the field — and
the database is left exactly as it was. Spec parsing is fuzzed with Hypothesis: any JSON
is either normalised or refused with ``InvalidSpec``, never another exception.

Complements ``tests/cli/test_cpctl.py`` and ``tests/api/test_auth_and_input_safety.py``
(which cover ``submit --spec`` and the list query parameters in depth).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.api.app import MAX_BODY, make_app
from controlplane.cli.main import main
from controlplane.clock import FakeClock
from controlplane.engine.decider import InvalidSpec
from controlplane.engine.observation import Observation
from controlplane.machines.selftest.steps import StepsDecider
from controlplane.machines.submission import submission_interests, validate_submission
from controlplane.store import migrate, reports
from controlplane.store.database import Database, open_database
from tests.machines.machines_gwt import (
    NS,
    POD,
    REPO,
    SRC_NODE,
    SRC_UID,
    TARGET,
    TEMPLATE,
    node,
    observe,
    pod,
)
from tests.support.machines import submit_steps

TOKEN = "bad-input-token-7c1e"
INJECTION = "'; DROP TABLE events; --"
HUGE = "x" * 100_000
COUNTED = ("machines", "events", "decisions", "machine_keys")


async def _counts(db: Database) -> dict[str, int]:
    return {t: int((await reports.rows(db, f"SELECT count(*) AS n FROM {t}"))[0]["n"])
            for t in COUNTED}


# --- the CLI --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cli_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite database holding one finished and one live machine."""
    path = tmp_path_factory.mktemp("cli") / "cp.db"
    url = f"sqlite:///{path}"

    async def prepare() -> None:
        db = open_database(url)
        await migrate.upgrade(db)
        clock = FakeClock()
        await submit_steps(db, clock, "live-1", steps=3)
        await db.dispose()

    asyncio.run(prepare())
    return url


def _db_counts(url: str) -> dict[str, int]:
    async def read() -> dict[str, int]:
        db = open_database(url)
        try:
            return await _counts(db)
        finally:
            await db.dispose()
    return asyncio.run(read())


def _cpctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``cpctl`` in this process (a subprocess per case would cost a second each)."""
    saved = structlog.get_config()  # main() points the logs at this test's captured stderr
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse refuses before running anything
        code = int(exc.code or 0)
    finally:
        structlog.configure(**saved)
    return code, capsys.readouterr().err


CLI_CASES: list[tuple[list[str], int, str]] = [
    # submit: kinds, ids, specs
    (["submit", "teleport"], 2, "unknown operation kind"),
    (["submit", INJECTION], 2, "unknown operation kind"),
    (["submit", "steps", "--spec", '{"steps": 1e400}'], 2, "spec.steps"),
    (["submit", "steps", "--spec", json.dumps({"steps": 2, "note": HUGE})], 2, "note"),
    (["submit", "steps", "--spec", '{"steps": 2, "gate_pod": "a/b", "gate_pod_uid": 5}'], 2,
     "gate_pod_uid"),
    (["submit", "steps", "--spec", '"steps"'], 2, "JSON object"),
    # A NUL (U+0000) in a spec was an internal error (exit 70) on PostgreSQL.
    (["submit", "steps", "--spec", '{"steps": 2, "gate_pod": "a/b", "gate_pod_uid": "u\\u0000"}'],
     2, "spec.gate_pod_uid contains a NUL character"),
    (["submit", "steps", "--spec", "{" * 5000], 2, "JSON"),
    (["submit", "migration", "--spec", "{}"], 2, "migrate"),
    (["submit", "steps", "--id", "live-1"], 2, "live-1"),
    # reading verbs with hostile ids
    (["get", INJECTION], 2, "no operation with id"),
    (["get", HUGE[:5000]], 2, "no operation with id"),
    (["history", INJECTION], 2, "no operation with id"),
    (["get", "live-1", "-o", "xml"], 2, "invalid choice"),
    # commands
    (["cancel", INJECTION], 2, "no operation with id"),
    (["retarget", INJECTION, "--to", "node-2"], 2, "no operation with id"),
    (["retarget", "live-1", "--to", INJECTION], 2, "Retarget refused"),
    (["retarget", "live-1"], 2, "--to"),
    (["wake", "--id", "a", "--key", "b"], 2, "not allowed with"),
    (["wake"], 2, "one of the arguments"),
    # listing and reports
    (["list", "--since", INJECTION], 2, "since"),
    (["list", "--limit", "0"], 2, "--limit"),
    (["list", "--limit", "99999999999999999999"], 2, "--limit"),
    (["report", "everything"], 2, "invalid choice"),
    (["report", "operations", "--by", "week"], 2, "invalid choice"),
    (["report", "operations", "--since", "2026-13-45"], 2, "since"),
    (["replay", "--fast"], 2, "unrecognized arguments"),
    # operator verbs: malformed workloads are refused before any cluster is contacted
    (["migrate", "nonamespace", "--to", "node-2", "--repository", REPO], 2,
     "is not NAMESPACE/POD"),
    (["checkpoint", "a/b/c", "--repository", REPO], 2, "is not NAMESPACE/POD"),
    (["suspend", "/pod", "--repository", REPO], 2, "is not NAMESPACE/POD"),
    (["resume", "default/never", "--repository", REPO], 2, "no suspension"),
    (["migrate", "default/app", "--repository", REPO], 2, "--to"),
    (["checkpoint", "default/app"], 2, "--repository"),
    (["migrate", "default/app", "--to", "n", "--repository", "r", "--wait-seconds", "-1"], 2,
     "--wait-seconds"),
    (["checkpoint", "default/app", "--repository", "r", "--max-operations", "lots"], 2,
     "--max-operations"),
    # worker, serve, sim, db
    (["worker", "--concurrency", "0"], 2, "--concurrency"),
    (["worker", "--poll-seconds", "nan"], 2, "--poll-seconds"),
    (["worker", "--lease-seconds", "inf"], 2, "--lease-seconds"),
    (["worker", "--kube-qps", "-1"], 2, "--kube-qps"),
    (["worker", "--kube-qps", "nan"], 2, "--kube-qps"),
    (["migrate", "default/app", "--to", "n", "--repository", "r", "--kube-burst", "0"], 2,
     "--kube-burst"),
    (["serve", "--token-file", "/nonexistent/token"], 2, "token"),
    (["sim", "up", "--nodes", "0"], 2, "--nodes"),
    (["sim", "launch"], 2, "unknown verb 'launch'; the verbs are up, nodes"),
    (["db", "drop"], 2, "unknown verb 'drop'; the verbs are upgrade, current"),
    (["--log-level", "trace", "list"], 2, "--log-level"),
]


@pytest.mark.parametrize(("argv", "code", "fragment"), CLI_CASES,
                         ids=[f"{i:02d}-{c[0][0]}" for i, c in enumerate(CLI_CASES)])
def test_every_cli_verb_refuses_bad_input_and_writes_nothing(
        cli_db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        argv: list[str], code: int, fragment: str) -> None:
    monkeypatch.delenv("CONTROLPLANE_API_TOKEN", raising=False)
    before = _db_counts(cli_db)
    got, err = _cpctl(capsys, "--db", cli_db, *argv)
    assert got == code, err
    assert fragment in err, err
    assert "Traceback" not in err
    assert err.strip().count("\n") == 0, "one line"
    assert _db_counts(cli_db) == before


@pytest.mark.parametrize("flag", ["--kind", "--phase", "--since", "--namespace"])
def test_hostile_list_filters_are_refused_naming_the_flag(
        cli_db: str, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """``list`` refuses a filter that cannot be a kind, phase, time or namespace (as the
    API does with 400), names the flag, and changes nothing."""
    before = _db_counts(cli_db)
    code, err = _cpctl(capsys, "--db", cli_db, "list", flag, INJECTION, "-o", "json")
    assert code == 2, err
    assert flag.removeprefix("--") in err
    assert _db_counts(cli_db) == before


def test_a_hostile_node_filter_is_bound_not_spliced(
        cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Node names are free text here: the injection string is a bound parameter that
    matches nothing, and nothing changes."""
    before = _db_counts(cli_db)
    code, err = _cpctl(capsys, "--db", cli_db, "list", "--node", INJECTION, "-o", "json")
    assert code == 0, err
    assert _db_counts(cli_db) == before


# --- the HTTP API ---------------------------------------------------------------------------

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def api(db: Database) -> AsyncIterator[tuple[Client, Database]]:
    await submit_steps(db, FakeClock(), "live-1", steps=3)
    async with TestClient(TestServer(make_app(db, token=TOKEN))) as client:
        yield client, db


OP = "/api/v1/operations/live-1"
API_CASES: list[tuple[str, str, Any, int, str]] = [
    # (method, path, body: None | bytes | JSON value, status, fragment of the error)
    ("GET", "/api/v1/operations?limit=99999999999999999999999", None, 400, "limit"),
    ("GET", "/api/v1/operations?surprise=1", None, 400, "surprise"),
    ("GET", f"/api/v1/operations?phase={HUGE[:8000]}", None, 400, "phase"),
    ("GET", "/api/v1/operations?since=9999-99-99", None, 400, "since"),
    ("GET", "/api/v1/operations?active=1", None, 400, "active"),
    ("GET", "/api/v1/operations/" + "a" * 4000, None, 404, "no operation with id"),
    # A NUL in an id was a 500 on PostgreSQL (its text cannot hold U+0000): now a 404.
    ("GET", "/api/v1/operations/%00%ff/events", None, 404, "no operation with id"),
    ("GET", "/api/v1/operations/live-1%00", None, 404, "no operation with id"),
    ("POST", "/api/v1/operations/%00/cancel", {}, 404, "no operation with id"),
    ("POST", f"{OP}/cancel", b"not json", 400, "not valid JSON"),
    ("POST", f"{OP}/cancel", [], 400, "JSON object"),
    ("POST", f"{OP}/cancel", {"force": True}, 400, "force"),
    ("POST", f"{OP}/cancel", b"\xff\xfe", 400, "JSON"),
    ("POST", "/api/v1/operations/ghost/cancel", {}, 404, "no operation with id"),
    ("POST", f"{OP}/retarget", {}, 400, "node"),
    ("POST", f"{OP}/retarget", {"node": 7}, 400, "node"),
    ("POST", f"{OP}/retarget", {"node": ["node-2"]}, 400, "node"),
    ("POST", f"{OP}/retarget", {"node": None}, 400, "node"),
    ("POST", f"{OP}/retarget", {"node": ""}, 400, "node"),
    ("POST", f"{OP}/retarget", {"node": INJECTION}, 409, "Retarget refused"),
    ("POST", f"{OP}/retarget", {"node": "node-2\x00"}, 409, "NUL"),
    ("POST", f"{OP}/retarget", {"node": "n" * 300}, 400, "node"),
    ("POST", f"{OP}/retarget", {"node": "node-2", "force": True}, 400, "force"),
    ("POST", f"{OP}/retarget", None, 400, "node"),
    ("POST", f"{OP}/retarget", b"x" * (MAX_BODY + 1), 413, "larger than"),
    ("POST", "/api/v1/operations/ghost/retarget", {"node": "node-2"}, 404,
     "no operation with id"),
    ("POST", f"{OP}/retarget", {"node": "node-2"}, 409, "Retarget refused"),
    ("GET", "/api/v1/reports/operations?by=week", None, 400, "by"),
    ("GET", "/api/v1/reports/operations?since=" + INJECTION, None, 400, "since"),
    ("GET", "/api/v1/reports/operations?surprise=1", None, 400, "surprise"),
    ("GET", "/api/v1/reports/" + INJECTION, None, 404, "no report"),
    ("GET", f"{OP}/cancel", None, 405, ""),
    ("DELETE", OP, None, 405, ""),
    ("PUT", "/api/v1/operations", {"kind": "steps"}, 405, ""),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "fragment"), API_CASES,
                         ids=[f"{i:02d}-{c[0]}" for i, c in enumerate(API_CASES)])
async def test_every_api_endpoint_refuses_bad_input_with_a_4xx_and_changes_nothing(
        api: tuple[Client, Database], method: str, path: str, body: Any, status: int,
        fragment: str) -> None:
    client, db = api
    before = await _counts(db)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    response = await client.request(method, path, data=data,
                                    headers={"Authorization": f"Bearer {TOKEN}",
                                             "Content-Type": "application/json"})
    assert response.status == status, await response.text()
    if status != 405:
        answer = await response.json()
        assert fragment in answer["error"] + answer.get("parameter", ""), answer
    assert await _counts(db) == before


async def test_without_the_token_nothing_is_answered_or_changed(
        api: tuple[Client, Database]) -> None:
    client, db = api
    before = await _counts(db)
    for method, path, body, _status, _fragment in API_CASES:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        response = await client.request(method, path, data=data)
        assert response.status in (401, 405), (method, path)
    response = await client.post(f"{OP}/cancel", data=b"{}")
    assert response.status == 401
    assert await _counts(db) == before


# --- fuzzing spec parsing -------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
    | st.text(max_size=30) | st.sampled_from(["", INJECTION, "a/b", NS, POD, SRC_UID, TARGET,
                                              "-", "x" * 300, "node-1\x00"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                 max_size=4),
    max_leaves=12)

def cluster() -> Observation:
    """The source pod Running on SRC_NODE, and the target node Ready."""
    return observe({f"{NS}/{POD}": pod()},
                   nodes={SRC_NODE: node(SRC_NODE), TARGET: node(TARGET)})


VALID: dict[str, dict[str, Any]] = {
    "migration": {"pod": {"namespace": NS, "name": POD, "uid": SRC_UID},
                  "source_node": SRC_NODE, "target_node": TARGET, "template": TEMPLATE,
                  "class": {"repository": REPO}},
    "checkpoint": {"pod": {"namespace": NS, "name": POD, "uid": SRC_UID},
                   "class": {"repository": REPO}},
    "suspend": {"pod": {"namespace": NS, "name": POD, "uid": SRC_UID},
                "template": TEMPLATE, "class": {"repository": REPO}},
}
FIELDS = sorted({k for spec in VALID.values() for k in spec} | {"steps", "node", "artifact"})


@st.composite
def mutated_specs(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(st.sampled_from(sorted(VALID)))
    spec = json.loads(json.dumps(VALID[kind]))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["replace", "drop", "add", "nested"]))
        key = draw(st.sampled_from(FIELDS))
        if how == "replace" or how == "add":
            spec[key] = draw(JSON)
        elif how == "drop":
            spec.pop(key, None)
        elif isinstance(spec.get(key), dict):
            inner = draw(st.sampled_from(sorted(spec[key]) or ["x"]))
            spec[key][inner] = draw(JSON)
    if draw(st.booleans()):
        return kind, spec
    return kind, draw(JSON)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_fuzzed_submissions_are_normalised_or_refused_with_invalid_spec(
        case: tuple[str, Any]) -> None:
    kind, spec = case
    if not isinstance(spec, dict):
        return  # the callers refuse non-objects before this (cpctl/API: "JSON object")
    submission_interests(kind, spec)  # never raises: it only picks what to observe
    try:
        normal = validate_submission(kind, spec, cluster())
    except InvalidSpec as exc:
        message = str(exc)  # a message for the operator
        assert message
        return
    # Accepted: the normal form is stable and still describes the same pod.
    assert validate_submission(kind, normal, cluster()) == normal
    assert normal["pod"] == {"namespace": NS, "name": POD, "uid": SRC_UID}
    if kind == "migration":
        assert (normal["source_node"], normal["target_node"]) == (SRC_NODE, TARGET)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_fuzzed_steps_specs_are_normalised_or_refused(spec: Any) -> None:
    decider = StepsDecider()
    if not isinstance(spec, dict):
        spec = {"steps": spec}
    try:
        normal = decider.validate_spec(spec)
    except InvalidSpec as exc:
        message = str(exc)
        assert message
        return
    assert decider.validate_spec(normal) == normal
