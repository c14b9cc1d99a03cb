"""The Grafana dashboard imports as is: every query goes to the data source its template
variable ``DS_PROMETHEUS`` names (no data source id of some other Grafana), panels have
unique ids and do not overlap in the grid, and ``deploy/monitoring``'s kustomization
renders (with ``kubectl kustomize``, as tests/deploy renders the overlays) into the
PrometheusRule, the PodMonitors and a ConfigMap holding this very dashboard. Whether each
query returns series is pinned against a real Prometheus in
``test_prometheus_end_to_end.py``."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import yaml

from tests.monitoring.tools import DASHBOARD, MONITORING, ROOT

DATA_SOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_every_query_uses_the_data_source_variable() -> None:
    d = dashboard()
    [variable] = d["templating"]["list"]
    assert variable["name"] == "DS_PROMETHEUS"
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert len(panels) >= 12
    for panel in panels:
        assert panel["datasource"] == DATA_SOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATA_SOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]
        assert panel["description"], panel["title"]


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    taken: dict[tuple[int, int], str] = {}
    for panel in panels:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]


def test_the_kustomization_renders_the_rule_the_monitors_and_this_dashboard() -> None:
    kubectl = os.environ.get("CONTROLPLANE_TEST_KUBECTL", str(ROOT / ".venv" / "bin" / "kubectl"))
    rendered = subprocess.run([kubectl, "kustomize", str(MONITORING)], capture_output=True,
                              text=True, timeout=60, check=False)
    assert rendered.returncode == 0, rendered.stderr  # scripts/ensure-kustomize installs it
    objects = {(o["kind"], o["metadata"]["name"]): o
               for o in yaml.safe_load_all(rendered.stdout)}
    assert set(objects) == {("PrometheusRule", "controlplane"), ("PodMonitor", "controlplane"),
                            ("PodMonitor", "checkpoint-agent"),
                            ("ConfigMap", "controlplane-grafana-dashboard")}
    assert all(o["metadata"]["namespace"] == "checkpoint-system" for o in objects.values())
    config = objects[("ConfigMap", "controlplane-grafana-dashboard")]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config["data"]["controlplane-dashboard.json"]) == dashboard()
