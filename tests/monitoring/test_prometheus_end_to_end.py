"""The shipped rules and dashboard in a real Prometheus scraping the running product.

One world for the module (:mod:`tests.monitoring.world`): the simulator, a node agent per
node, a worker and the API, each scraped every second, while real operations run — a
migration, then, with node-1's agent killed (SIGKILL), a checkpoint waiting on node-1
and another cancelled there. Pins: Prometheus's own alerts API shows
``ControlPlaneNodeAgentAbsent`` firing for node-1 (and only node-1) while its agent is
gone and its checkpoint waits, and no longer once the agent is back, which then serves
the checkpoint; every panel of the Grafana dashboard evaluates without error to at least
one series over the run; ``promtool check metrics`` has nothing to say about a live
scrape of the API, the worker and an agent.

With ``MONITORING_DASHBOARD_PNG=docs/img/dashboard-prometheus.png`` the panel test also
renders the panels' results into that picture (``scripts/render-dashboard``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.monitoring.tools import DASHBOARD, ROOT, promtool
from tests.monitoring.world import NODES, Monitored, monitored
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

ALERT = "ControlPlaneNodeAgentAbsent"
#: Grafana's own variables in the panels' queries, as Grafana would fill them in here.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1s", "$__range": "5m"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    with monitored(tmp_path_factory.mktemp("monitored")) as w:
        for name in ("app-1", "app-2", "app-3"):
            w.d.pod(name, "node-1")
        migrated = w.cluster("migrate", "default/app-1", "--to", "node-2", "--wait",
                             "--wait-seconds", "60")
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        yield w


@dataclass(frozen=True)
class AgentGone:
    """What Prometheus said while node-1's agent was dead and after it came back."""

    killed_at: float
    firing: list[dict[str, Any]]  # the agent alerts once one fired
    serving: list[dict[str, Any]]  # node-1's agent series once the alert was gone
    checkpoint: subprocess.CompletedProcess[str]  # `cpctl wait` of the waiting one
    cancelled: subprocess.CompletedProcess[str]  # `cpctl wait` of the cancelled one


@pytest.fixture(scope="module")
def agent_gone(world: Monitored) -> AgentGone:
    """Kill node-1's agent while work waits on node-1; wait for the alert; restart it."""
    w = world
    killed_at = time.time()
    w.kill_agent("node-1")
    waiting = w.cluster("checkpoint", "default/app-2")
    assert waiting.returncode == 0, waiting.stderr
    cancelled = w.cluster("checkpoint", "default/app-3")
    assert cancelled.returncode == 0, cancelled.stderr
    cancel = w.cpctl("cancel", cancelled.stdout.split()[0])
    assert cancel.returncode == 0, cancel.stderr

    def agent_alerts() -> list[dict[str, Any]]:
        return [a for a in w.prometheus.alerts() if a["labels"]["alertname"] == ALERT]

    firing = wait_for(lambda: [a for a in agent_alerts() if a["state"] == "firing"],
                      f"{ALERT} firing", 60, every=0.25)
    w.restart_agent("node-1", generation=2)

    def back() -> list[dict[str, Any]]:
        serving = w.prometheus.query('controlplane_agent_serving{node="node-1"}')
        return serving if serving and not agent_alerts() else []

    serving = wait_for(back, f"node-1's agent scraped again and {ALERT} resolved", 60,
                       every=0.25)
    return AgentGone(killed_at, firing, serving,
                     w.cpctl("wait", waiting.stdout.split()[0], "--wait-seconds", "60"),
                     w.cpctl("wait", cancelled.stdout.split()[0], "--wait-seconds", "60"))


def test_the_agent_alert_fires_for_the_killed_agents_node_and_resolves_when_it_is_back(
        agent_gone: AgentGone) -> None:
    [alert] = agent_gone.firing
    assert alert["labels"]["node"] == "node-1"
    assert alert["labels"]["severity"] == "critical"
    assert float(alert["value"]) >= 1  # node-1's live operations
    assert "`cpctl list --node node-1 --active`" in alert["annotations"]["description"]
    active_at = datetime.strptime(alert["activeAt"][:19], "%Y-%m-%dT%H:%M:%S")
    assert active_at.replace(tzinfo=UTC).timestamp() >= int(agent_gone.killed_at)
    [back] = agent_gone.serving  # resolved because the agent answers again
    assert back["metric"]["job"] == "controlplane-agent"
    assert back["value"][1] == "1"
    # The agent that came back served the checkpoint that waited for it.
    assert agent_gone.checkpoint.returncode == 0, agent_gone.checkpoint.stdout
    assert agent_gone.cancelled.returncode == 1, agent_gone.cancelled.stdout


def test_every_dashboard_panel_evaluates_to_series_over_the_run(
        world: Monitored, agent_gone: AgentGone) -> None:
    end = time.time()
    empty, failed = [], []
    results = {}
    for panel, expr in panel_queries():
        query = expr
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        answer = world.prometheus.query_range(query, start=world.started, end=end)
        if answer.get("status") != "success":
            failed.append(f"{panel}: {query}: {answer.get('error')}")
        elif not answer["data"]["result"]:
            empty.append(f"{panel}: {query}")
        else:
            results[expr] = answer["data"]["result"]
    assert not failed, "queries that failed:\n" + "\n".join(failed)
    assert not empty, "queries that returned no series:\n" + "\n".join(empty)
    picture = os.environ.get("MONITORING_DASHBOARD_PNG")
    if picture:
        end = more_operations(world)
        rendered = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "render-dashboard"), "--prometheus",
             world.prometheus.url, "--start", f"{world.started:.3f}", "--end", f"{end:.3f}",
             "--out", str(ROOT / picture)], capture_output=True, text=True, timeout=120,
            check=False)
        assert rendered.returncode == 0, rendered.stdout + rendered.stderr


@pytest.mark.parametrize("part", ["api", "worker", *NODES])
def test_promtool_has_nothing_to_say_about_a_live_scrape(world: Monitored, part: str) -> None:
    url = {"api": f"{world.api_url}/metrics",
           "worker": f"http://{world.worker_metrics}/metrics"}.get(
        part, f"http://{world.agent_metrics.get(part)}/metrics")
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    assert "controlplane_" in text
    checked = promtool("check", "metrics", stdin=text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == ""


def more_operations(w: Monitored) -> float:
    """For the picture only: a few more migrations and checkpoints, so that each chart of
    a short run has a line (a histogram's series appear with the first operation of
    their kind, and a rate needs the next one); when they ended."""
    for target, source in (("node-1", "node-2"), ("node-2", "node-1"), ("node-1", "node-2")):
        pod = next(p["metadata"]["name"] for p in w.d.pods()
                   if p["spec"]["nodeName"] == source and p["metadata"]["name"].startswith("app-1"))
        moved = w.cluster("migrate", f"default/{pod}", "--to", target, "--wait")
        assert moved.returncode == 0, moved.stdout + moved.stderr
        checked = w.cluster("checkpoint", "default/app-2", "--wait")
        assert checked.returncode == 0, checked.stdout + checked.stderr
    done = time.time()

    def scraped_since() -> bool:
        latest = w.prometheus.query("max(timestamp(controlplane_history_events))")
        return bool(latest) and float(latest[0]["value"][1]) > done + 3

    wait_for(scraped_since, "three more seconds of scrapes for the picture", 30, every=0.5)
    return time.time()


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel of the shipped dashboard."""
    dashboard = json.loads(Path(DASHBOARD).read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    assert found
    return found
