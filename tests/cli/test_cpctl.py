"""``cpctl`` as operators run it (a real subprocess): outcomes, one-line errors, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from tests.conftest import PG_ADMIN_URL
from tests.support.cpctl import (
    ROOT,
    assert_one_line_error,
    cpctl,
    in_process,
    reap,
    upgraded,
)

pytestmark = pytest.mark.slow  # real subprocesses (or a browser): its file starts first


@pytest.fixture
def ready_db(db_url: str) -> str:
    return upgraded(db_url)


def test_submit_run_inspect_and_replay_a_machine_end_to_end(ready_db: str) -> None:
    """Submit, the worker and replay run as processes; the reads between them run through
    the same ``main`` in this process (each a second of interpreter start saved: this
    test ran 20 processes, 50 s on a loaded machine)."""
    submitted = cpctl(ready_db, "submit", "steps", "--spec", '{"steps": 3}', "--id", "job-1")
    assert (submitted.returncode, submitted.stdout.strip()) == (0, "job-1")
    ran = cpctl(ready_db, "worker", "--until-done", "--poll-seconds", "0.05")
    assert ran.returncode == 0, ran.stderr
    got = json.loads(in_process(ready_db, "get", "job-1", "-o", "json").stdout)
    assert (got["phase"], got["version"], got["terminal"]) == ("Succeeded", 4, True)
    history = json.loads(in_process(ready_db, "history", "job-1", "-o", "json").stdout)
    assert [e["type"] for e in history] == ["Submitted"] + ["StepCompleted"] * 3
    table = in_process(ready_db, "history", "job-1").stdout
    assert "StepCompleted" in table
    assert "SEQ" in table
    listed = json.loads(in_process(ready_db, "list", "--kind", "steps", "-o", "json").stdout)
    assert [m["id"] for m in listed["items"]] == ["job-1"]
    any_case = json.loads(in_process(ready_db, "list", "--phase", "succeeded", "-o", "json").stdout)
    assert [m["id"] for m in any_case["items"]] == ["job-1"]  # the phase, whatever its case
    assert_one_line_error(in_process(ready_db, "list", "--phase", "Done"), 2,
                          "--phase 'Done' is not a phase", "Succeeded", "RolledBack")
    assert (listed["total"], listed["limit"]) == (1, 100)
    as_yaml = yaml.safe_load(in_process(ready_db, "get", "job-1", "-o", "yaml").stdout)
    assert (as_yaml["phase"], as_yaml["version"]) == ("Succeeded", 4)
    as_yaml_history = yaml.safe_load(in_process(ready_db, "history", "job-1", "-o", "yaml").stdout)
    assert [e["type"] for e in as_yaml_history] == [e["type"] for e in history]
    report = json.loads(in_process(ready_db, "report", "operations", "-o", "json").stdout)
    assert [(r["kind"], r["count"]) for r in report] == [("steps", 1)]
    csv_out = in_process(ready_db, "report", "operations", "--by", "day", "-o", "csv").stdout
    assert csv_out.splitlines()[0].startswith("day,count,succeeded")
    replay = cpctl(ready_db, "replay", "--verify")
    assert replay.returncode == 0, replay.stdout
    assert "0 mismatches" in replay.stdout
    assert replay.stdout.splitlines()[-1] == (  # the demo's plain sentence ends it
        "1 operation replayed: 0 projections that disagree with their history, "
        "0 decisions that would now differ")


def test_unknown_machine_id_is_one_line_exit_2(ready_db: str) -> None:
    for verb in ("get", "history", "cancel"):
        assert_one_line_error(cpctl(ready_db, verb, "no-such-id"), 2, "no-such-id",
                              "cpctl list")


def test_cancelling_a_finished_machine_is_refused_with_its_phase(ready_db: str) -> None:
    cpctl(ready_db, "submit", "steps", "--spec", '{"steps": 1}', "--id", "j")
    cpctl(ready_db, "worker", "--until-done", "--poll-seconds", "0.05")
    assert_one_line_error(cpctl(ready_db, "cancel", "j"), 2, "already Succeeded")


@pytest.mark.parametrize(("spec", "fragment"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"steps": 0}', "spec.steps must be from 1 to 1000"),
    ('{"steps": "six"}', "spec.steps must be an integer"),
    ('{"stepz": 3}', "unknown field(s) stepz"),
    ('{"steps": 99999999999999999999}', "spec.steps must be from 1 to 1000"),
    ('{"gate_pod": "no-slash", "gate_pod_uid": "u"}', "spec.gate_pod must be 'namespace/name'"),
    ('{"gate_pod": "a/b"}', "must be given together"),
    ("@/nonexistent/spec.json", "cannot read spec file"),
])
def test_a_malformed_spec_names_the_field_and_writes_nothing(
    ready_db: str, spec: str, fragment: str
) -> None:
    assert_one_line_error(cpctl(ready_db, "submit", "steps", "--spec", spec), 2, fragment)
    assert json.loads(cpctl(ready_db, "list", "-o", "json").stdout)["items"] == []


def test_an_unknown_kind_lists_the_known_ones(ready_db: str) -> None:
    assert_one_line_error(cpctl(ready_db, "submit", "teleport"), 2, "unknown operation kind",
                          "steps")


def test_an_unreachable_database_is_one_line_exit_3() -> None:
    result = cpctl("postgresql://postgres@127.0.0.1:1/nowhere", "list")
    assert_one_line_error(result, 3, "cannot reach the database", "127.0.0.1:1",
                          "CONTROLPLANE_DATABASE_URL")


def test_a_database_the_server_does_not_have_is_a_configuration_error_naming_the_fix() -> None:
    """Not exit 70 ("this is a bug"): the server answers that the database is not there."""
    server = PG_ADMIN_URL.rsplit("/", 1)[0]
    result = cpctl(f"{server}/cp_no_such_database_{uuid.uuid4().hex[:8]}", "list")
    assert_one_line_error(result, 3, "does not exist", "createdb", "cpctl db upgrade")


@pytest.mark.parametrize(("url", "fragment"), [
    ("mysql://root@localhost/db", "unsupported backend 'mysql'"),
    ("not a url", "is not a URL"),
    ("sqlite://", "names no file"),
])
def test_a_bad_database_url_says_what_form_to_use(url: str, fragment: str) -> None:
    assert_one_line_error(cpctl(url, "list"), 2, fragment, "sqlite:///")


def test_a_missing_sqlite_file_is_named_and_not_created(tmp_path: Path) -> None:
    """``cpctl list`` where the default relative path finds nothing: it says which file
    it looked for (absolute) and creates none, rather than an empty database it would
    then advise upgrading."""
    result = subprocess.run([sys.executable, "-m", "controlplane.cli.main",
                             "--db", "sqlite:///var/controlplane.db", "list"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert_one_line_error(result, 3, f"no database at {tmp_path}/var/controlplane.db",
                          "working directory", "cpctl db upgrade")
    assert list(tmp_path.iterdir()) == []


def test_a_database_without_schema_points_to_db_upgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert_one_line_error(cpctl(url, "list"), 3, "cpctl db upgrade")
    current = cpctl(url, "db", "current")
    assert current.returncode == 4
    assert "needs upgrade" in current.stdout


@pytest.mark.parametrize("args", [
    ["list", "--limit", "-5"],
    ["list", "--limit", "lots"],
    ["worker", "--lease-seconds", "0"],
    ["list", "--since", "yesterday"],
    ["submit", "steps", "--id", "x" * 65],  # longer than the id column: refused, not a 70
    ["frobnicate"],
])
def test_bad_flags_are_refused_with_exit_2(ready_db: str, args: list[str]) -> None:
    result = cpctl(ready_db, *args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_help_explains_verbs_and_exit_codes() -> None:
    result = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "--help"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for word in ("submit", "history", "replay", "worker", "demo", "exit codes"):
        assert word in result.stdout


def test_sim_up_serves_a_cluster_with_the_asked_nodes_until_sigterm(tmp_path: Path) -> None:
    import signal
    import urllib.request

    kubeconfig = tmp_path / "kube.yaml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "sim", "up", "--nodes", "2",
         "--kubeconfig", str(kubeconfig)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server is up
        assert "listening on http://127.0.0.1:" in line
        url = line.split("listening on ")[1].split()[0]
        assert url in kubeconfig.read_text()
        with urllib.request.urlopen(f"{url}/api/v1/nodes", timeout=10) as resp:
            nodes = json.loads(resp.read())["items"]
        assert len(nodes) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        reap(proc)


def test_demo_migrates_suspends_and_resumes_with_the_markers_surviving(tmp_path: Path) -> None:
    """README's first command: the product end to end on the embedded default, with a
    relative work directory as ``make demo`` gives it (``var/demo``)."""
    result = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "demo", "--workdir", "demo"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "marker 'counter=41' survived" in out
    assert "marker 'session=7' survived" in out
    assert "0 projection mismatches, 0 decisions that would now differ" in out
    assert "checkpoints sealed (encrypted and signed)" in out
    for outcome in ("checkpoint  default/web", "migration   default/app", "Suspended",
                    "Resumed"):
        assert outcome in out
    assert "-> Restoring" in out  # the history shows the phase changes
    assert "report: checkpoints" in out
    assert "the migration phase by phase (report_migrations): queued " in out
    assert (tmp_path / "demo" / "controlplane.db").exists()


def test_retarget_is_refused_for_kinds_that_cannot_move(ready_db: str) -> None:
    cpctl(ready_db, "submit", "steps", "--spec", '{"steps": 2}', "--id", "s1")
    assert_one_line_error(cpctl(ready_db, "retarget", "s1", "--to", "node-2"), 2,
                          "Retarget refused", "only Cancel")
    assert_one_line_error(cpctl(ready_db, "retarget", "nope", "--to", "node-2"), 2, "nope")


def test_submitting_a_product_kind_raw_points_to_its_verb(ready_db: str) -> None:
    assert_one_line_error(cpctl(ready_db, "submit", "migration", "--spec", "{}"), 2,
                          "cpctl migrate NAMESPACE/POD")


def test_serve_answers_with_the_token_and_refuses_without_it(ready_db: str,
                                                             tmp_path: Path) -> None:
    import signal
    import urllib.error
    import urllib.request

    token = "s3cret-token-for-the-api-test"
    (tmp_path / "token").write_text(token + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "--db", ready_db, "serve",
         "--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "token")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" on ")[1].strip().rstrip("/")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/api/v1/operations", timeout=10)
        assert refused.value.code == 401
        refused.value.close()
        req = urllib.request.Request(f"{url}/api/v1/operations",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        out, err = reap(proc)
    assert token not in out + err


def test_serve_refuses_to_start_without_a_usable_token(ready_db: str, tmp_path: Path) -> None:
    assert "CONTROLPLANE_API_TOKEN" not in os.environ
    assert_one_line_error(cpctl(ready_db, "serve", "--listen", "127.0.0.1:0"), 2,
                          "requires a bearer token, and none was given", "openssl rand",
                          "--token-file")
    (tmp_path / "short.token").write_text("tiny\n")
    assert_one_line_error(cpctl(ready_db, "serve", "--listen", "127.0.0.1:0", "--token-file",
                                str(tmp_path / "short.token")), 2,
                          "of at least 16 characters (too short: default)")


def test_wake_by_key_or_id_reports_how_many_machines_it_woke(ready_db: str) -> None:
    spec = '{"steps": 1, "gate_pod": "ns/p", "gate_pod_uid": "uid-9"}'
    cpctl(ready_db, "submit", "steps", "--spec", spec, "--id", "gated")
    woke = cpctl(ready_db, "wake", "--key", "uid-9")
    assert (woke.returncode, woke.stdout.strip()) == (0, "woke 1 machine(s)")
    assert cpctl(ready_db, "wake", "--key", "nobody").stdout.strip() == "woke 0 machine(s)"
    assert cpctl(ready_db, "wake", "--id", "gated").returncode == 0
    assert_one_line_error(cpctl(ready_db, "wake", "--id", "missing"), 2, "missing")
    assert cpctl(ready_db, "wake").returncode == 2  # one of --id/--key is required


def test_a_worker_serves_its_own_metrics_and_health_until_sigterm(ready_db: str) -> None:
    assert cpctl(ready_db, "submit", "steps", "--spec", '{"steps": 2}',
                 "--id", "w-1").returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "--db", ready_db, "worker",
         "--poll-seconds", "0.05", "--worker-id", "w-metrics",
         "--metrics-listen", "127.0.0.1:0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().split("; metrics ")[1].strip()  # the starting line
        base = base.removesuffix("/metrics")

        def scrape() -> str:
            with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
                return str(reply.read().decode())

        deadline = time.monotonic() + 60
        while 'controlplane_worker_transitions_total{kind="steps",worker="w-metrics"} 2' \
                not in (text := scrape()):
            assert time.monotonic() < deadline, text
            time.sleep(0.05)  # another process: nothing to await
        assert 'controlplane_worker_lease_losses_total{worker="w-metrics"} 0' in text
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as reply:
            assert json.loads(reply.read())["status"] == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        reap(proc)


def test_version_prints_the_release_pyproject_names() -> None:
    """``cpctl --version``: the release CHANGELOG.md describes, with no database needed."""
    import tomllib

    release = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    result = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "--version"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert (result.returncode, result.stdout) == (0, f"cpctl {release}\n"), result
    assert f"## {release}" in (ROOT / "CHANGELOG.md").read_text()


def test_a_unique_id_prefix_names_its_operation_and_an_ambiguous_one_lists_them(
        ready_db: str) -> None:
    """In process: the verbs' exit codes and lines are main's (the process is pinned by the
    end-to-end test above)."""
    for machine_id in ("abcd-1111", "abcd-2222", "ab%d-3333"):
        assert in_process(ready_db, "submit", "steps", "--spec", '{"steps": 1}', "--id",
                     machine_id).returncode == 0
    got = json.loads(in_process(ready_db, "get", "abcd-1", "-o", "json").stdout)
    assert got["id"] == "abcd-1111"
    history = json.loads(in_process(ready_db, "history", "abcd-2", "-o", "json").stdout)
    assert [e["type"] for e in history] == ["Submitted"]
    assert_one_line_error(in_process(ready_db, "get", "abcd"), 2,
                          "id prefix 'abcd' names more than one operation: abcd-1111, "
                          "abcd-2222", "give more characters")
    # Fewer than 4 characters is never a prefix; % and _ are characters, not patterns.
    assert_one_line_error(in_process(ready_db, "get", "abc"), 2, "no operation with id 'abc'")
    assert json.loads(in_process(ready_db, "get", "ab%d", "-o", "json").stdout)["id"] == "ab%d-3333"
    assert_one_line_error(in_process(ready_db, "get", "ab_d-1"), 2, "no operation with id")


def test_a_drain_prefix_names_the_drain_and_the_dashboards_end_names_a_child(
        ready_db: str) -> None:
    """A drain child's id is ``<drain id>-<12 hex>``: a prefix of the drain's id names
    the drain (not "more than one"), and the end the dashboard shows (``…`` + 12 hex)
    names the child; another operation sharing the prefix is still ambiguous."""
    drain = "d0d0d0d0-aaaa"
    children = [f"{drain}-111111111111", f"{drain}-222222222222"]
    for machine_id in (drain, *children, "d0d0d0d0-bbbb"):
        assert in_process(ready_db, "submit", "steps", "--spec", '{"steps": 1}', "--id",
                          machine_id).returncode == 0
    assert json.loads(in_process(ready_db, "get", "d0d0d0d0-a", "-o", "json").stdout)[
        "id"] == drain
    for shown, child in (("\u2026111111111111", children[0]), ("...2222", children[1])):
        assert json.loads(in_process(ready_db, "get", shown, "-o", "json").stdout)[
            "id"] == child
    assert_one_line_error(in_process(ready_db, "get", "d0d0d0d0"), 2,
                          "id prefix 'd0d0d0d0' names more than one operation: "
                          f"{drain}, {children[0]}, {children[1]}, d0d0d0d0-bbbb",
                          "give more characters")
    assert_one_line_error(in_process(ready_db, "get", "\u20269999"), 2,
                          "no operation with id '\u20269999'")
