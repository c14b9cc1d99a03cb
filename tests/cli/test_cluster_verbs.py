"""Operators drive the product through separate processes, as in a real deployment:
``cpctl sim up`` (the cluster), one ``python -m drivers.agent`` per node, ``cpctl worker
--kubeconfig`` and the verbs ``migrate``, ``suspend``, ``resume`` with ``--wait``."""

from __future__ import annotations

import json
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.process_deployment import MARKER, REPO, Deployment

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One deployment for the module (five processes to start: a tenth of its time was
    starting them per test): each test uses pods of its own names and waits for the
    operations it submits, so the next one meets an idle worker under its limit."""
    tmp_path = tmp_path_factory.mktemp("cluster-verbs")
    d = Deployment(tmp_path)
    try:
        sim = d.start("sim", "controlplane.cli.main", "sim", "up", "--nodes", "3",
                      "--kubeconfig", str(d.kubeconfig))
        assert sim.stdout is not None
        d.url = sim.stdout.readline().split("listening on ")[1].split()[0]
        for node in ("node-1", "node-2", "node-3"):
            d.agents[node] = agent = d.start(f"agent-{node}", "drivers.agent", "--node", node,
                            "--kubeconfig", str(d.kubeconfig), "--layout", str(d.layout),
                            "--dumper", "sim", "--workdir", str(tmp_path / "work" / node))
            assert agent.stdout is not None
            assert agent.stdout.readline()  # one line once it serves
        assert d.cpctl("db", "upgrade").returncode == 0
        worker = d.start("worker", "controlplane.cli.main", "--db", d.db, "worker",
                         "--worker-id", "w-1", "--poll-seconds", "0.05", "--max-operations",
                         "1", "--metrics-listen", "127.0.0.1:0", *d.cluster_args())
        assert worker.stdout is not None
        d.worker_line = worker.stdout.readline()  # one line once it serves
        yield d
    finally:
        d.stop()


def test_migrate_then_suspend_and_resume_keep_the_workload_state(
    deployment: Deployment,
) -> None:
    d = deployment
    d.api("/api/v1/namespaces/default/pods", {
        "metadata": {"name": "app", "labels": {"app": "app"},
                     "annotations": {MARKER: "counter=41"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "pause"}]}})
    d.wait(lambda: any(p["metadata"]["name"] == "app" and p["status"].get("phase") == "Running"
                       for p in d.pods()), "app running")

    checkpointed = d.cpctl("checkpoint", "default/app", "--repository", REPO, "--wait",
                           *d.cluster_args())
    assert checkpointed.returncode == 0, checkpointed.stdout + checkpointed.stderr
    assert "checkpoint default/app: Succeeded" in checkpointed.stdout
    assert [p["metadata"]["name"] for p in d.pods()] == ["app"]  # it keeps running

    migrated = d.cpctl("migrate", "default/app", "--to", "node-2", "--repository", REPO,
                       "--wait", "--wait-seconds", "60", *d.cluster_args())
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "migrate default/app: Succeeded" in migrated.stdout
    progress = [line for line in migrated.stdout.splitlines()
                if line.startswith("migrate default/app: ") and "Succeeded" not in line]
    assert all(", waiting for " in line for line in progress), progress
    migration_id = migrated.stdout.split()[0]
    assert_operator_views_of_the_migration(d, migration_id)
    [moved] = d.pods()
    assert moved["spec"]["nodeName"] == "node-2"
    assert moved["metadata"]["annotations"][MARKER] == "counter=41"
    name = moved["metadata"]["name"]

    suspended = d.cpctl("suspend", f"default/{name}", "--repository", REPO, "--wait",
                        *d.cluster_args())
    assert suspended.returncode == 0, suspended.stdout + suspended.stderr
    assert d.pods() == []
    # No --repository: the resume takes the class the suspension recorded.
    resumed = d.cpctl("resume", f"default/{name}", "--node", "node-3", "--wait",
                      *d.cluster_args())
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    resume = json.loads(d.cpctl("get", resumed.stdout.split()[0], "-o", "json").stdout)
    suspend = json.loads(d.cpctl("get", suspended.stdout.split()[0], "-o", "json").stdout)
    assert resume["spec"]["class"] == suspend["spec"]["class"]
    assert resume["spec"]["class"]["repository"] == REPO
    [back] = d.wait(lambda: [p for p in d.pods() if p["status"].get("phase") == "Running"],
                    "the resumed pod running")
    assert back["metadata"]["annotations"][MARKER] == "counter=41"
    assert back["spec"]["nodeName"] == "node-3"


def assert_operator_views_of_the_migration(d: Deployment, migration_id: str) -> None:
    """``list`` filters, ``history`` phase changes and the migrations report, by CLI."""
    def listed(*flags: str) -> list[str]:
        out = d.cpctl("list", "--kind", "migration", *flags, "-o", "json")
        assert out.returncode == 0, out.stderr
        return [m["id"] for m in json.loads(out.stdout)["items"]]

    assert listed("--node", "node-1") == [migration_id]  # the node it left
    assert listed("--node", "node-2") == [migration_id]  # the node it went to
    assert listed("--node", "node-3") == []
    assert listed("--namespace", "default") == [migration_id]
    assert listed("--namespace", "kube-system") == []
    table = d.cpctl("history", migration_id).stdout
    assert "-> Restoring" in table
    assert "-> Succeeded" in table
    history = json.loads(d.cpctl("history", migration_id, "-o", "json").stdout)
    assert history[-1]["phase"] == "Succeeded"
    assert [e["phase"] for e in history if e["type"] == "SourceDeleted"] == ["Restoring"]
    report = d.cpctl("report", "migrations", "--by", "node", "-o", "csv")
    assert report.returncode == 0, report.stderr
    header, row = report.stdout.splitlines()
    fields = dict(zip(header.split(","), row.split(","), strict=True))
    assert (fields["node"], fields["count"], fields["succeeded"]) == ("node-1", "1", "1")
    assert float(fields["p50_restore_seconds"]) > 0
    assert int(fields["bytes"]) > 0


def test_the_worker_says_who_it_is_where_it_works_under_which_limits_and_its_metrics(
    deployment: Deployment,
) -> None:
    d = deployment
    line = d.worker_line.strip()
    assert line.startswith(f"worker w-1 starting: database sqlite+aiosqlite:///{d.tmp}/cp.db; "
                           f"cluster kubeconfig {d.kubeconfig}, registry layout {d.layout}; "
                           "concurrency 32, lease 30s; admits under --max-operations 1, "
                           "--max-per-node 2; metrics http://127.0.0.1:"), line
    metrics_url = line.split("metrics ")[-1]
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        assert resp.status == 200


def test_a_checkpoint_class_from_the_classes_file_is_embedded_in_the_operation(
    deployment: Deployment, tmp_path: Path,
) -> None:
    d = deployment
    d.pod("gpu-worker", "node-1")
    classes = tmp_path / "classes.yaml"
    classes.write_text(f"classes:\n- name: gpu\n  repository: {REPO}\n"
                       "  restore_attempts: 5\n  timeouts:\n    capture: 120\n")
    done = d.cpctl("checkpoint", "default/gpu-worker", "--class", "gpu", "--classes-file",
                   str(classes), "--wait", *d.cluster_args())
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(d.cpctl("get", done.stdout.split()[0], "-o", "json").stdout)
    klass = got["spec"]["class"]
    assert (klass["name"], klass["repository"], klass["restore_attempts"]) == (
        "gpu", REPO, 5)
    assert klass["timeouts"]["capture"] == 120
    report = json.loads(d.cpctl("report", "checkpoints", "--by", "class", "-o", "json").stdout)
    by_class = {r["class"]: r["count"] for r in report}  # earlier tests' are "default"
    assert by_class["gpu"] == 1, report


def test_verbs_refuse_bad_requests_with_one_line(deployment: Deployment) -> None:
    d = deployment
    for args, fragment in [
        (("migrate", "default/ghost", "--to", "node-2"), "default/ghost not found"),
        (("migrate", "nonamespace", "--to", "node-2"), "is not NAMESPACE/POD"),
        (("resume", "default/never"), "no suspension of default/never"),
    ]:
        result = d.cpctl(*args, "--repository", REPO, *d.cluster_args())
        assert result.returncode == 2, result.stderr
        assert fragment in result.stderr
        assert "Traceback" not in result.stderr
    for args, fragment in [
        (("checkpoint", "default/app"), "--repository REGISTRY/REPO, or --class NAME"),
        (("checkpoint", "default/app", "--class", "gpu"), "needs a classes file"),
    ]:
        result = d.cpctl(*args, *d.cluster_args())
        assert result.returncode == 2, result.stderr
        assert fragment in result.stderr


def test_migrate_and_suspend_refuse_a_controller_owned_pod_naming_its_owner(
        deployment: Deployment) -> None:
    d = deployment
    d.api("/api/v1/namespaces/default/pods", {
        "metadata": {"name": "web-5d7f-x2", "labels": {"app": "web"}, "ownerReferences": [{
            "apiVersion": "batch/v1", "kind": "Job", "name": "web-5d7f",
            "uid": "0b5e6c1e-0000-4000-8000-000000000001", "controller": True}]},
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "pause"}]}})
    d.wait(lambda: any(p["metadata"]["name"] == "web-5d7f-x2" and
                       p["status"].get("phase") == "Running" for p in d.pods()), "web running")
    for verb in (("migrate", "default/web-5d7f-x2", "--to", "node-2"),
                 ("suspend", "default/web-5d7f-x2")):
        result = d.cpctl(*verb, "--repository", REPO, *d.cluster_args())
        assert result.returncode == 2, result.stdout + result.stderr
        assert "owned by Job default/web-5d7f" in result.stderr
        assert "cold copy" in result.stderr  # what would go wrong
        assert "cpctl checkpoint default/web-5d7f-x2" in result.stderr  # what to do instead
        assert "Traceback" not in result.stderr
    # A checkpoint deletes nothing: the owner does not matter.
    done = d.cpctl("checkpoint", "default/web-5d7f-x2", "--repository", REPO, "--wait",
                   *d.cluster_args())
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p["metadata"]["name"] for p in d.pods() if p["metadata"]["name"].startswith(
        "web-")] == ["web-5d7f-x2"]  # nothing was deleted or created


def test_a_class_that_declares_an_owner_kind_movable_migrates_its_pods(
        deployment: Deployment, tmp_path: Path) -> None:
    d = deployment
    d.api("/api/v1/namespaces/default/pods", {
        "metadata": {"name": "sb-1", "annotations": {MARKER: "session=9"},
                     "ownerReferences": [{"apiVersion": "agents.example.com/v1",
                                          "kind": "Sandbox", "name": "sb",
                                          "uid": "0b5e6c1e-0000-4000-8000-000000000002",
                                          "controller": True}]},
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "pause"}]}})
    d.wait(lambda: any(p["metadata"]["name"] == "sb-1" and
                       p["status"].get("phase") == "Running" for p in d.pods()), "sb-1 running")
    refused = d.cpctl("migrate", "default/sb-1", "--to", "node-2", "--repository", REPO,
                      *d.cluster_args())
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "owners: {Sandbox: move}" in refused.stderr  # how to declare it
    classes = tmp_path / "classes.yaml"
    classes.write_text(f"classes:\n- name: sandboxes\n  repository: {REPO}\n"
                       "  owners:\n    Sandbox: move\n")
    done = d.cpctl("migrate", "default/sb-1", "--to", "node-2", "--class", "sandboxes",
                   "--classes-file", str(classes), "--wait", *d.cluster_args())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(pod default/sb-1)" in done.stdout
    [moved] = [p for p in d.pods() if p["metadata"]["name"] == "sb-1"]
    assert moved["spec"]["nodeName"] == "node-2"
    assert moved["metadata"]["annotations"][MARKER] == "session=9"


def test_an_operation_over_the_limit_queues_and_the_worker_admits_it_when_a_slot_frees(
    deployment: Deployment,
) -> None:
    """Limits queue, they do not refuse; the product worker is the admitter."""
    d = deployment
    d.pod("first", "node-1")
    d.pod("second", "node-2")
    limit = ("--max-operations", "1")
    d.agents["node-1"].send_signal(signal.SIGSTOP)  # first's capture cannot finish yet
    try:
        first = d.cpctl("checkpoint", "default/first", "--repository", REPO, *limit,
                        *d.cluster_args())
        assert first.returncode == 0, first.stderr
        second = d.cpctl("checkpoint", "default/second", "--repository", REPO, *limit,
                         *d.cluster_args())
        assert second.returncode == 0, second.stderr
        second_id = second.stdout.split()[0]
        assert "queued: cluster limit: 1 of 1 operations running" in second.stdout
        held = json.loads(d.cpctl("get", second_id, "-o", "json").stdout)
        assert held["phase"] == "Requested"
        assert held["next_wake_at"] is None  # held: nobody drives it
    finally:
        d.agents["node-1"].send_signal(signal.SIGCONT)

    def succeeded() -> bool:
        got = json.loads(d.cpctl("get", second_id, "-o", "json").stdout)
        return bool(got["phase"] == "Succeeded")

    d.wait(succeeded, "the queued checkpoint to be admitted and succeed", limit=60)
    history = json.loads(d.cpctl("history", second_id, "-o", "json").stdout)
    assert [e["type"] for e in history][:3] == ["Submitted", "Queued", "Admitted"]


def test_migrate_refuses_a_name_for_a_pod_its_controller_names(deployment: Deployment) -> None:
    d = deployment
    d.api("/api/v1/namespaces/default/pods", {
        "metadata": {"name": "db-1", "labels": {"app": "db"}, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
            "uid": "0b5e6c1e-0000-4000-8000-000000000002", "controller": True}]},
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "pause"}]}})
    d.wait(lambda: any(p["metadata"]["name"] == "db-1" and
                       p["status"].get("phase") == "Running" for p in d.pods()), "db-1 running")
    result = d.cpctl("migrate", "default/db-1", "--to", "node-2", "--name", "db-9",
                     "--repository", REPO, *d.cluster_args())
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--name: 'db-9': pod default/db-1 belongs to StatefulSet db" in result.stderr
    assert "Traceback" not in result.stderr
