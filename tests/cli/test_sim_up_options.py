"""``cpctl sim up`` takes every option of the simulator, through the CLI as a user runs it.

Each test starts ``python -m controlplane.cli.main sim up ...`` as a process, reads its one
ready line and asks the served cluster over HTTP: the nodes carry the asked capacity, a pod
turns Running no sooner than ``--start-seconds``, a ``--fault`` answers with its code, the
same ``--seed`` fails the same requests; bad values exit 2 with one line naming the flag,
and ``--help`` lists every option with its default. ``python -m drivers.sim up`` is the
same command (same parser, same errors).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
CPCTL = [sys.executable, "-m", "controlplane.cli.main"]
pytestmark = pytest.mark.slow


def _start(tmp: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CPCTL, "sim", "up", "--kubeconfig", str(tmp / "kube.yaml"),
                             *flags], cwd=tmp, env=ENV, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def _ready(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """The ready line and the URL in it (the word after ``listening on``)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until it serves (or exits: "")
    assert "listening on " in line, f"no ready line: {line!r}"
    return line.strip(), line.split("listening on ")[1].split()[0]


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGTERM, then its exit code and the rest of its stdout."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=10)
    return proc.returncode, out


@contextlib.contextmanager
def sim_up(tmp: Path, *flags: str) -> Iterator[tuple[str, str]]:
    """A ``cpctl sim up`` process with ``flags``: (its ready line, its URL); it must stop
    cleanly on SIGTERM."""
    proc = _start(tmp, *flags)
    try:
        yield _ready(proc)
    finally:
        code, out = _stop(proc)
    assert code == 0
    assert "simulated cluster stopped" in out


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the response and its socket
        return int(exc.code)


def _time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z")


def test_nodes_carry_the_asked_capacity_and_the_ready_line_says_the_shape(
        tmp_path: Path) -> None:
    """``--nodes/--node-cpu/--node-memory/--node-pods`` shape every node (capacity =
    allocatable), and the ready line says so."""
    with sim_up(tmp_path, "--nodes", "2", "--node-cpu", "16", "--node-memory", "64Gi",
                "--node-pods", "30") as (line, url):
        assert "(2 nodes, each cpu 16, memory 64Gi, pods 30)" in line
        assert f"kubeconfig: {tmp_path / 'kube.yaml'}" in line
        nodes = _get(f"{url}/api/v1/nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["node-1", "node-2"]
    for node in nodes:
        for field in ("capacity", "allocatable"):
            got = node["status"][field]
            assert (got["cpu"], got["memory"], got["pods"]) == ("16", "64Gi", "30"), node


def test_a_pod_turns_running_no_sooner_than_start_seconds(tmp_path: Path) -> None:
    """With ``--start-seconds 3`` a bound pod's recorded start is at least 3 s after its
    creation (both server timestamps; whole seconds, so the bound holds exactly), and it
    does turn Running."""
    with sim_up(tmp_path, "--nodes", "1", "--start-seconds", "3") as (line, url):
        assert "pods start after 3s, stop after 0s" in line
        _post(f"{url}/api/v1/namespaces/default/pods", {
            "metadata": {"name": "app"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "pause"}]}})
        deadline = time.monotonic() + 30
        pod = _get(f"{url}/api/v1/namespaces/default/pods/app")
        while pod["status"].get("phase") != "Running" and time.monotonic() < deadline:
            time.sleep(0.1)  # another process: nothing to await
            pod = _get(f"{url}/api/v1/namespaces/default/pods/app")
    assert pod["status"]["phase"] == "Running"
    started = _time(pod["status"]["startTime"]) - _time(pod["metadata"]["creationTimestamp"])
    assert started.total_seconds() >= 3


def test_an_installed_fault_answers_with_its_code_and_only_where_it_applies(
        tmp_path: Path) -> None:
    """``--fault error,verb=list,resource=nodes,rate=1,code=503``: every node list gets
    503, a pod list does not; the ready line names the fault and the seed."""
    spec = "error,verb=list,resource=nodes,rate=1,code=503"
    with sim_up(tmp_path, "--fault", spec, "--seed", "5") as (line, url):
        assert f"1 standing fault(s), seed 5: {spec}" in line
        assert [_status(f"{url}/api/v1/nodes") for _ in range(3)] == [503, 503, 503]
        assert _status(f"{url}/api/v1/namespaces/default/pods") == 200


def test_the_same_seed_fails_the_same_requests(tmp_path: Path) -> None:
    """A 50% error fault on ``get``: two clusters with ``--seed 11`` fail the same ones of
    24 requests sent in order, one with ``--seed 12`` another set (fixed seeds: the
    outcome is determined, not likely)."""
    spec = "error,verb=get,resource=namespaces,rate=0.5,code=500"
    runs = {}
    for name, seed in (("a", "11"), ("b", "11"), ("c", "12")):
        (tmp_path / name).mkdir()
        with sim_up(tmp_path / name, "--fault", spec, "--seed", seed) as (line, url):
            assert f"seed {seed}" in line
            runs[name] = "".join(
                "x" if _status(f"{url}/api/v1/namespaces/default") == 500 else "."
                for _ in range(24))
    assert runs["a"] == runs["b"]
    assert "x" in runs["a"]
    assert "." in runs["a"]
    assert runs["c"] != runs["a"]


#: Bad values and the flag the one-line refusal must name.
BAD = {
    "nodes-zero": (["--nodes", "0"], "--nodes"),
    "nodes-not-a-number": (["--nodes", "many"], "--nodes"),
    "port-out-of-range": (["--port", "70000"], "--port"),
    "cpu-not-a-quantity": (["--node-cpu", "abc"], "--node-cpu"),
    "memory-negative": (["--node-memory", "-1Gi"], "--node-memory"),
    "pods-zero": (["--node-pods", "0"], "--node-pods"),
    "start-negative": (["--start-seconds", "-1"], "--start-seconds"),
    "stop-not-a-number": (["--stop-seconds", "nan"], "--stop-seconds"),
    "fault-unknown-kind": (["--fault", "nonsense"], "--fault"),
    "fault-bad-rate": (["--fault", "error,rate=2"], "--fault"),
    "fault-unknown-key": (["--fault", "latency,seconds=1,colour=red"], "--fault"),
    "seed-not-a-number": (["--seed", "x"], "--seed"),
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str]]:
    """Every bad case run at once (each is a process start): name -> (exit, out, err)."""
    tmp = tmp_path_factory.mktemp("bad")
    procs = {name: _start(tmp, *flags) for name, (flags, _) in BAD.items()}
    results = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # it served: the value was not refused
            _stop(proc)
            out, err = "", "still running"
        results[name] = (proc.returncode, out, err)
    return results


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_value_exits_2_with_one_line_naming_the_flag(
        refusals: dict[str, tuple[int, str, str]], case: str) -> None:
    code, out, err = refusals[case]
    flag = BAD[case][1]
    assert code == 2, (out, err)
    assert out == "", "nothing served, no ready line"
    assert err.count("\n") == 1, err
    assert err.startswith("cpctl: error: "), err
    assert flag in err, err


SIM_UP_OPTIONS = ("--nodes", "--kubeconfig", "--port", "--node-cpu", "--node-memory",
                  "--node-pods", "--start-seconds", "--stop-seconds", "--fault", "--seed",
                  "--no-kubelets")


def test_help_lists_every_option_with_its_default() -> None:
    """``cpctl sim up --help`` names every option, each with its default, and the fault
    spec syntax; ``python -m drivers.sim up --help`` prints the same text."""
    result = subprocess.run([*CPCTL, "sim", "up", "--help"], cwd=ROOT, env=ENV, text=True,
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    options = result.stdout.split("\noptions:\n")[1].split("\n\n")[0]
    helps = dict(re.findall(r"^  (--[a-z-]+)[^\n]*?  (\S.*?)(?=^  -|\Z)", options,
                            re.MULTILINE | re.DOTALL))
    assert set(helps) >= set(SIM_UP_OPTIONS), sorted(helps)
    for flag in SIM_UP_OPTIONS:
        assert "default" in helps[flag], (flag, helps[flag])
    assert "error,rate=R" in result.stdout
    assert "forbid,verb=V,resource=R" in result.stdout
    alias = subprocess.run([sys.executable, "-m", "drivers.sim", "up", "--help"], cwd=ROOT,
                           env=ENV, text=True, capture_output=True, timeout=60)
    assert alias.returncode == 0, alias.stderr
    assert alias.stdout == result.stdout


def test_python_m_drivers_sim_refuses_as_cpctl_does(tmp_path: Path) -> None:
    """The scripts' spelling is the same command: the same refusal, the same exit code."""
    result = subprocess.run([sys.executable, "-m", "drivers.sim", "up", "--node-cpu", "abc"],
                            cwd=tmp_path, env=ENV, text=True, capture_output=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("cpctl: error: --node-cpu: 'abc'"), result.stderr
