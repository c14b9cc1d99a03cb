"""``/metrics`` is valid Prometheus text with the expected series and values, and the
OpenAPI document describes every route the application serves."""

from __future__ import annotations

import re

from aiohttp import web
from aiohttp.test_utils import TestClient

from controlplane.api import metrics
from controlplane.api.app import make_app
from controlplane.clock import FakeClock
from controlplane.engine.decider import Action
from controlplane.machines.selftest.steps import WORK_ACTION
from controlplane.store import reports
from controlplane.store.database import Database
from controlplane.worker.errors import TerminalActionError
from tests.support.api_world import TOKEN, History, auth
from tests.support.machines import submit_steps
from tests.support.workers import RecordingHandler, all_terminal, make_worker, run_until

Client = TestClient[web.Request, web.Application]

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
SAMPLE = re.compile(rf"({_NAME})(?:\{{(?:{_LABEL}(?:,{_LABEL})*)?\}})? "
                    r"(-?[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?|\+Inf|-Inf|NaN)")
META = re.compile(rf"# (HELP {_NAME} .*|TYPE {_NAME} (counter|gauge|histogram|summary|untyped))")


def parse(text: str) -> tuple[dict[str, str], list[tuple[str, str, float]]]:
    """Types by family and (name, labels, value) samples; fails on any bad line."""
    types: dict[str, str] = {}
    samples: list[tuple[str, str, float]] = []
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("#"):
            assert META.fullmatch(line), line
            if line.startswith("# TYPE"):
                _, _, name, kind = line.split(" ")
                assert name not in types, f"{name} typed twice"
                types[name] = kind
            continue
        match = SAMPLE.fullmatch(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        name = match.group(1)
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert family in types or name in types, f"{name} has no # TYPE"
        samples.append((name, line[len(name):line.rindex(" ")], float(match.group(2))))
    return types, samples


async def test_metrics_text_parses_and_has_the_expected_series(
        client: Client, history: History) -> None:
    response = await client.get("/metrics", headers=auth())
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    types, samples = parse(await response.text())
    assert types == {
        "controlplane_operations": "gauge",
        "controlplane_operation_duration_seconds": "histogram",
        "controlplane_gc_failures_total": "counter",
        "controlplane_events_total": "counter",
        "controlplane_transitions_total": "counter",
        "controlplane_queue_depth": "gauge",
        "controlplane_action_failures_total": "counter",
        "controlplane_migration_phase_duration_seconds": "histogram",
        "controlplane_operation_wake_overdue_seconds": "gauge",
        "controlplane_node_operations": "gauge",
        "controlplane_operations_failed_total": "counter",
        "controlplane_checkpoint_bytes_total": "counter",
        "controlplane_history_events": "gauge",
    }
    ops = {labels: v for name, labels, v in samples if name == "controlplane_operations"}
    assert ops['{kind="migration",phase="Succeeded"}'] == 1
    assert ops['{kind="resume",phase="Resumed"}'] == 1
    assert sum(ops.values()) == 4
    counts = {labels: v for name, labels, v in samples
              if name == "controlplane_operation_duration_seconds_count"}
    assert counts == {'{kind="checkpoint"}': 1, '{kind="migration"}': 1,
                      '{kind="resume"}': 1, '{kind="suspend"}': 1}
    inf = [v for name, labels, v in samples
           if name == "controlplane_operation_duration_seconds_bucket" and 'le="+Inf"' in labels]
    assert inf == [1, 1, 1, 1]
    events = (await reports.rows(history.db, "SELECT count(*) AS n FROM events"))[0]["n"]
    single = {name: v for name, _, v in samples}
    assert single["controlplane_events_total"] == events
    assert single["controlplane_gc_failures_total"] == 0
    by_kind = {labels: v for name, labels, v in samples
               if name == "controlplane_transitions_total"}
    assert sum(by_kind.values()) == events
    assert by_kind['{kind="migration"}'] >= 10
    depth = {labels: v for name, labels, v in samples if name == "controlplane_queue_depth"}
    assert depth == {'{state="admission"}': 0, '{state="due"}': 0, '{state="leased"}': 0}
    assert not [s for s in samples if s[0] == "controlplane_action_failures_total"]
    phases = {labels: v for name, labels, v in samples
              if name == "controlplane_migration_phase_duration_seconds_count"}
    assert phases == {f'{{phase="{p}"}}': 1 for p in
                      ("checkpoint", "delete", "gc", "queued", "restore")}


async def test_histogram_buckets_are_cumulative(client: Client) -> None:
    _, samples = parse(await (await client.get("/metrics", headers=auth())).text())
    by_kind: dict[str, list[float]] = {}
    for name, labels, value in samples:
        if name == "controlplane_operation_duration_seconds_bucket":
            by_kind.setdefault(labels.split(",")[0], []).append(value)
    assert by_kind
    for values in by_kind.values():
        assert values == sorted(values)


async def test_openapi_document_lists_every_route(client: Client, history: History) -> None:
    response = await client.get("/api/v1/openapi.json")
    assert response.status == 200
    doc = await response.json()
    assert doc["openapi"].startswith("3.1")
    served = set()
    for route in make_app(history.db, token=TOKEN).router.routes():
        if route.method == "HEAD":
            continue
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter")
        served.add((path, route.method.lower()))
    documented = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert served == documented


async def test_failed_actions_and_held_operations_show_in_the_metrics(
        db: Database, clock: FakeClock) -> None:
    async def refuse(action: Action) -> None:
        raise TerminalActionError("403 Forbidden")

    await submit_steps(db, clock, "m1", steps=2)
    await run_until(make_worker(db, clock, RecordingHandler(hook=refuse)), all_terminal(db))
    await submit_steps(db, clock, "m2", steps=1)  # due, nobody claims it
    _, samples = parse(await metrics.render(db, clock.now()))
    values = {(name, labels): v for name, labels, v in samples}
    assert values[("controlplane_action_failures_total",
                   f'{{action="{WORK_ACTION}",error_class="Terminal"}}')] == 1
    assert values[("controlplane_queue_depth", '{state="due"}')] == 1
    assert values[("controlplane_queue_depth", '{state="leased"}')] == 0
    assert values[("controlplane_transitions_total", '{kind="steps"}')] == 4  # 3 + 1
