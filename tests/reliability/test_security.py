"""Security properties that a source scan or a pure call can prove.

- the HTTP API compares the token in constant time (``hmac.compare_digest``, never ``==``)
  and refuses every data route without it (behaviour: ``tests/api/test_auth_and_input_safety.py``);
- every value that reaches SQL is a bound parameter: no SQL text is built from input
  (an AST scan of the runtime code; the only interpolations are identifiers picked from
  constant allow-lists, listed below with why);
- the node agent refuses a capture request whose pod UID or node does not match.

Secrets in logs and events: ``test_fault_campaign.py`` (a whole flow with an API token
and registry credentials). RBAC least privilege: ``tests/deploy/``.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from controlplane.engine.observation import PodView
from controlplane.machines.contract import protocol
from drivers.agent.errors import RequestRefused
from drivers.agent.requests import CAPTURE_NODE, capture_request, judge_capture
from tests.reliability.sqlscan import built_sql_calls, sql_fstrings

ROOT = Path(__file__).resolve().parents[2]
#: Interpolations into SQL text that are not input: (file, interpolated expression) -> why.
ALLOWED_INTERPOLATIONS = {
    # The view and its time column come from the constant REPORTS mapping, keyed by a
    # report name the CLI/API check against that mapping; the value (since) is bound.
    ("controlplane/store/reports.py", "view"): "constant REPORTS lookup",
    ("controlplane/store/reports.py", "time_col"): "constant REPORTS lookup",
}
#: Schema migrations run at upgrade time with no input at all; their view DDL splices
#: dialect snippets (e.g. SQLite vs PostgreSQL date arithmetic) written in the migration.
SCHEMA_ONLY = ("migrations/",)


def _scan() -> dict[str, dict[str, list[list[Any]]]]:
    result = subprocess.run([sys.executable, "-m", "tests.reliability.sqlscan"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, check=True)
    report: dict[str, dict[str, list[list[Any]]]] = json.loads(result.stdout)
    return report


def test_no_sql_text_interpolates_anything_but_allow_listed_identifiers() -> None:
    bad = []
    for rel, found in _scan()["fstrings"].items():
        for line, expr in found:
            if (rel, expr) not in ALLOWED_INTERPOLATIONS:
                bad.append(f"{rel}:{line}: {{{expr}}} spliced into SQL text")
    assert bad == [], "bind these as parameters (:name) instead:\n" + "\n".join(bad)


def test_no_sql_is_built_by_concatenation_or_format_in_an_execute_call() -> None:
    """``text()``, ``execute()`` and ``exec_driver_sql()`` take constant SQL or a name."""
    bad = [f"{rel}:{line}: {call}" for rel, found in _scan()["calls"].items()
           for line, call in found]
    assert bad == []


def test_the_scan_would_catch_an_injected_query(tmp_path: Path) -> None:
    """The scanner is not vacuous."""
    sample = tmp_path / "bad.py"
    sample.write_text('def q(name):\n    return f"SELECT * FROM machines WHERE id = \'{name}\'"\n')
    assert sql_fstrings(sample) == [(2, "name")]
    sample.write_text('def q(db, name):\n    return db.execute("SELECT 1 WHERE a = " + name)\n')
    assert [line for line, _ in built_sql_calls(sample)] == [2]


def test_migrations_are_schema_only() -> None:
    """Migrations take no input: nothing in them reads a request, a spec or the env."""
    for path in ROOT.glob("migrations/**/*.py"):
        source = path.read_text()
        assert "os.environ" not in source or path.name == "env.py", path
        assert "input(" not in source, path


def test_the_api_token_is_compared_in_constant_time() -> None:
    source = (ROOT / "controlplane/api/app.py").read_text()
    assert "hmac.compare_digest(" in source
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            names = {ast.unparse(n) for n in (node.left, *node.comparators)}
            assert not any("TOKEN" in n or "token" in n or "presented" in n for n in names), \
                f"line {node.lineno}: a token compared with {ast.unparse(node)}"


def _pod(uid: str = "uid-1", node: str | None = "node-1", **notes: str) -> PodView:
    annotations = {protocol.PROTOCOL: "v1", protocol.CAPTURE_CHECKPOINT_ID: "ck-1",
                   protocol.CAPTURE_ARTIFACT: "localhost:5000/ckpt:ck-1",
                   protocol.CAPTURE_SOURCE_UID: "uid-1", **notes}
    return PodView("default", "app", uid, node, "Running", annotations=annotations)


@pytest.mark.parametrize(("pod", "agent_node", "reason"), [
    (_pod(uid="uid-2"), "node-1", "not the source"),
    (_pod(node="node-2"), "node-1", "not on this agent's node"),
    (_pod(**{CAPTURE_NODE: "node-9"}), "node-1", "names node 'node-9'"),
    (_pod(**{protocol.CAPTURE_SOURCE_UID: ""}), "node-1", "(none)"),
    (_pod(**{protocol.PROTOCOL: "v99"}), "node-1", "not supported"),
    (_pod(**{protocol.CAPTURE_ARTIFACT: "'; rm -rf / #"}), "node-1", "capture-artifact"),
], ids=["foreign-uid", "other-node", "request-names-other-node", "no-uid", "version",
        "hostile-artifact"])
def test_the_agent_refuses_a_capture_whose_uid_or_node_does_not_match(
        pod: PodView, agent_node: str, reason: str) -> None:
    request = capture_request(pod)
    assert request is not None
    with pytest.raises(RequestRefused, match=re.escape(reason)):
        judge_capture(request, pod, node=agent_node)


def test_the_agent_accepts_the_matching_request() -> None:
    pod = _pod(**{CAPTURE_NODE: "node-1"})
    request = capture_request(pod)
    assert request is not None
    assert str(judge_capture(request, pod, node="node-1")) == "localhost:5000/ckpt:ck-1"
