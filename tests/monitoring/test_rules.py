"""The shipped alert rules, judged by Prometheus's own ``promtool``: they load (``check
rules``, the plain file and the PrometheusRule's groups alike, which are equal), every
alert fires and stays quiet on the input series of ``rules.test.yml`` (``test rules``),
and every alert points at a runbook section of ``docs/alerts.md`` whose ``cpctl``
commands, like those in the alert's own description, are commands ``cpctl`` accepts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.cli.main import build_parser
from controlplane.machines.checkpoint.machine import CheckpointPhase
from controlplane.machines.drain.state import DrainPhase
from controlplane.machines.migration.state import MigrationPhase
from controlplane.machines.restore.machine import RestorePhase
from controlplane.machines.resume.machine import ResumePhase
from controlplane.machines.selftest.steps import StepsPhase
from controlplane.machines.suspend.machine import SuspendPhase
from tests.monitoring.tools import (
    ALERTS_DOC,
    PROMETHEUS_RULE,
    RULES,
    UNIT_TESTS,
    alerts,
    promtool,
    rules_for_test,
    shipped_rules,
)

#: What the runbooks' placeholders stand for when a command is parsed.
PLACEHOLDERS = {"{{ $labels.kind }}": "migration", "{{ $labels.node }}": "node-1",
                "<an hour ago>": "2026-11-28T10:00:00Z", " ID": " 0123abcd",
                "--keep-days N": "--keep-days 30", "KIND": "migration", "NODE": "node-1"}
#: Every kind's phases: a runbook's ``--phase`` must name one of them.
PHASES = (CheckpointPhase, DrainPhase, MigrationPhase, RestorePhase, ResumePhase, StepsPhase,
          SuspendPhase)


def test_promtool_checks_the_plain_rules_file() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts()) + 3} rules found" in checked.stdout, checked.stdout


def test_the_prometheusrule_holds_the_same_groups_and_promtool_checks_them(
        tmp_path: Path) -> None:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == shipped_rules()["groups"]
    spec = tmp_path / "from-prometheusrule.yml"
    spec.write_text(yaml.safe_dump(rule["spec"]))
    checked = promtool("check", "rules", str(spec))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_unit_tests_pass() -> None:
    tested = promtool("test", "rules", *map(str, UNIT_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert tested.stdout.count("SUCCESS") == len(UNIT_TESTS), tested.stdout


def test_promtool_unit_tests_fail_when_an_alert_does_not_fire(tmp_path: Path) -> None:
    """The unit tests can fail: with the agent alert's ``for:`` an hour long, its firing
    expectation no longer holds and ``promtool test rules`` says so."""
    slow = rules_for_test(tmp_path / "slow.rules.yml", for_="1h")
    tests = yaml.safe_load(UNIT_TESTS[0].read_text())
    tests["rule_files"] = [str(slow)]
    tests["tests"] = [t for t in tests["tests"]
                      if any(c["alertname"] == "ControlPlaneNodeAgentAbsent"
                             for c in t["alert_rule_test"])]
    changed = tmp_path / "rules.test.yml"
    changed.write_text(yaml.safe_dump(tests, sort_keys=False))
    tested = promtool("test", "rules", str(changed))
    assert tested.returncode == 1, tested.stdout + tested.stderr
    assert "ControlPlaneNodeAgentAbsent" in tested.stdout + tested.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases = [case for path in UNIT_TESTS for test in yaml.safe_load(path.read_text())["tests"]
             for case in test["alert_rule_test"]]
    for alert in alerts():
        name = alert["alert"]
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: no test where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{name}: no test where it is quiet"


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: str(a["alert"]))
def test_each_alert_says_what_it_means_and_what_to_run_first(alert: dict[str, Any]) -> None:
    notes = alert["annotations"]
    assert notes["summary"]
    assert "\n" not in notes["summary"]
    assert alert["labels"]["severity"] in ("warning", "critical")
    commands = cpctl_commands(notes["description"])
    assert commands, f"{alert['alert']}: its description names no cpctl command"
    for command in commands:
        assert_cpctl_accepts(command)
    anchor = notes["runbook_url"].removeprefix("docs/alerts.md#")
    assert anchor == alert["alert"].lower()
    sections = runbook_sections()
    assert alert["alert"] in sections, f"docs/alerts.md has no section {alert['alert']}"
    section = sections[alert["alert"]]
    for heading in ("What it means", "Look first", "Likely causes", "What to do"):
        assert f"**{heading}**" in section, f"{alert['alert']}: no '{heading}'"
    first = cpctl_commands(section.split("**Look first**")[1].split("**Likely causes**")[0])
    assert first, f"{alert['alert']}: its runbook's 'Look first' names no cpctl command"
    for command in cpctl_commands(section):
        assert_cpctl_accepts(command)


def test_the_runbooks_name_only_alerts_the_rules_have() -> None:
    assert sorted(runbook_sections()) == sorted(a["alert"] for a in alerts())


def cpctl_commands(text: str) -> list[str]:
    return re.findall(r"`(cpctl [^`]+)`", text)


def runbook_sections() -> dict[str, str]:
    parts = re.split(r"^## ", ALERTS_DOC.read_text(), flags=re.MULTILINE)[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts
            if part.startswith("ControlPlane")}


def assert_cpctl_accepts(command: str) -> None:
    """``command`` parses with cpctl's own parser, and its ``--phase`` is a real phase."""
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    words = command.split()[1:]
    try:
        build_parser().parse_args(words)
    except SystemExit as exc:
        raise AssertionError(f"cpctl refuses `{command}` (exit {exc.code})") from None
    if "--phase" in words:
        phase = words[words.index("--phase") + 1].lower()
        known = {str(p.value).lower() for enum in PHASES for p in enum}
        assert phase in known, f"`{command}`: no kind has a phase {phase!r}"
