"""Prometheus's own tools for the monitoring tests: where ``promtool`` and ``prometheus``
are (Debian's ``prometheus`` package, installed by ``scripts/ensure-prometheus``; missing
ones fail the test, never skip it), running ``promtool``, and the shipped rules as data.

:func:`rules_for_test` derives the copy a short end-to-end run loads from the shipped
``deploy/monitoring/controlplane.rules.yml``: the same rules, every ``for:`` shortened, so
an alert fires in seconds instead of minutes. Used by ``tests/monitoring``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "controlplane.rules.yml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "controlplane-dashboard.json"
ALERTS_DOC = ROOT / "docs" / "alerts.md"
#: promtool unit tests: minute-by-minute series, and the history alert's days of them.
UNIT_TESTS = (Path(__file__).with_name("rules.test.yml"),
              Path(__file__).with_name("history.test.yml"))


def binary(name: str) -> str:
    """The path of ``promtool`` or ``prometheus``; a failure saying how to install it."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists()
                                   else None)
    assert found, f"{name} is missing: run scripts/ensure-prometheus (Debian's prometheus)"
    return found


def promtool(*args: str, stdin: str | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` run to its end; its exit status and output, for the test to judge."""
    return subprocess.run([binary("promtool"), *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, check=False)


def shipped_rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return loaded


def alerts() -> list[dict[str, Any]]:
    """Every alerting rule of the shipped rules file, in file order."""
    return [rule for group in shipped_rules()["groups"] for rule in group["rules"]
            if "alert" in rule]


def rules_for_test(target: Path, *, for_: str) -> Path:
    """Write the shipped rules with every alert's ``for:`` set to ``for_`` to ``target``."""
    rules = shipped_rules()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = for_
    target.write_text(yaml.safe_dump(rules, sort_keys=False))
    return target
