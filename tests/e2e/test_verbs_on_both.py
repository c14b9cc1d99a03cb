"""Every operator verb end to end, on the simulator AND on a real kube-apiserver.

The same test runs twice: against the simulator, and against the session's real API
server (envtest v1.36, nodes from the kubelet role), with the product deployed as
processes beside it (node agents on the sim dumper, one worker, ``cpctl`` verbs). The real
server is the judge of what each request means; a verb that passes only on the simulator
fails here. Each test uses pods of its own (unique names and an ``app`` label).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.sim import MARKER
from tests.e2e.world import REPO, Obj, World, open_world, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["sim", "real"])
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    real = request.getfixturevalue("real_cluster") if request.param == "real" else None
    with open_world(request.param, tmp_path_factory.mktemp(f"e2e-{request.param}"),
                    real) as w:
        yield w


def _id(stdout: str) -> str:
    return stdout.split()[0]


def _only_running(w: World, app: str) -> Obj:
    """The one Running pod labelled ``app`` (a duplicate would fail here)."""
    pods = wait_for(lambda: w.running_pods(f"app={app}") or None, f"a running {app}")
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def _node(pod: Obj) -> str:
    return str(pod["spec"]["nodeName"])


def _marker(pod: Obj) -> str:
    return str(pod["metadata"]["annotations"].get(MARKER))


def test_checkpoint_proves_the_artifact_and_keeps_the_workload_running(world: World) -> None:
    w = world
    name = w.name("ckpt")
    source = w.make_pod(name, "node-1", marker="n=1", labels={"app": name})
    out = w.ok("checkpoint", f"{w.namespace}/{name}", "--repository", REPO, "--wait")
    assert f"checkpoint {w.namespace}/{name}: Succeeded" in out
    still = _only_running(w, name)
    assert still["metadata"]["uid"] == source["metadata"]["uid"]


def test_migrate_moves_the_state_and_removes_the_source(world: World) -> None:
    w = world
    name = w.name("mig")
    source = w.make_pod(name, "node-1", marker="counter=41", labels={"app": name})
    out = w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-2", "--repository", REPO,
               "--wait", "--wait-seconds", "90")
    # A bare pod keeps its name: the restored pod takes it once the source is gone.
    assert f"migrate {w.namespace}/{name}: Succeeded (pod {w.namespace}/{name})" in out
    moved = _only_running(w, name)
    assert moved["metadata"]["name"] == name
    assert _node(moved) == "node-2"
    assert _marker(moved) == "counter=41"
    assert moved["metadata"]["uid"] != source["metadata"]["uid"]
    assert w.get(_id(out))["pod"] == f"{w.namespace}/{name}"  # cpctl get says it too
    # ... so the next operation on the workload finds it by the same name.
    out = w.ok("checkpoint", f"{w.namespace}/{name}", "--repository", REPO, "--wait")
    assert f"checkpoint {w.namespace}/{name}: Succeeded" in out


def test_migrate_with_a_name_gives_the_restored_pod_that_name(world: World) -> None:
    w = world
    name = w.name("named")
    w.make_pod(name, "node-1", marker="n=2", labels={"app": name})
    out = w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-3", "--name", f"{name}-b",
               "--repository", REPO, "--wait", "--wait-seconds", "90")
    assert f"(pod {w.namespace}/{name}-b)" in out
    moved = _only_running(w, name)
    assert moved["metadata"]["name"] == f"{name}-b"
    assert _marker(moved) == "n=2"


def test_retarget_before_the_source_is_deleted_restores_on_the_new_target(world: World) -> None:
    w = world
    name = w.name("ret")
    w.make_pod(name, "node-1", marker="counter=7", labels={"app": name})
    with w.paused("node-1"):  # the capture cannot finish: the source is still there
        op = _id(w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-2",
                      "--repository", REPO))
        w.ok("retarget", op, "--to", "node-3", cluster=False)
    assert w.wait_phase(op, "Succeeded", "Failed", "RolledBack", "Cancelled") == "Succeeded"
    moved = _only_running(w, name)
    assert (_node(moved), _marker(moved)) == ("node-3", "counter=7")


def test_cancel_before_the_source_is_deleted_keeps_the_workload_in_place(world: World) -> None:
    w = world
    name = w.name("can")
    source = w.make_pod(name, "node-1", marker="counter=3", labels={"app": name})
    with w.paused("node-1"):
        op = _id(w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-2",
                      "--repository", REPO))
        w.ok("cancel", op, cluster=False)
    assert w.wait_phase(op, "Succeeded", "Failed", "RolledBack", "Cancelled") == "Cancelled"
    kept = _only_running(w, name)
    assert kept["metadata"]["uid"] == source["metadata"]["uid"]
    assert _node(kept) == "node-1"


def test_suspend_then_resume_restores_the_state_on_another_node(world: World) -> None:
    w = world
    name = w.name("sus")
    w.make_pod(name, "node-1", marker="counter=99", labels={"app": name})
    w.ok("suspend", f"{w.namespace}/{name}", "--repository", REPO, "--wait")
    wait_for(lambda: not w.kube.pods(w.namespace, f"app={name}"), f"{name} gone")
    w.ok("resume", f"{w.namespace}/{name}", "--node", "node-3", "--repository", REPO, "--wait")
    back = _only_running(w, name)
    assert (_node(back), _marker(back)) == ("node-3", "counter=99")


def test_restore_creates_a_pod_from_a_checkpoint_on_the_chosen_node(world: World) -> None:
    w = world
    name = w.name("rst")
    w.make_pod(name, "node-1", marker="counter=5", labels={"app": name})
    checkpoint = _id(w.ok("checkpoint", f"{w.namespace}/{name}", "--repository", REPO,
                          "--wait"))
    copy = w.name("copy")
    w.ok("restore", checkpoint, "--node", "node-2", "--name", copy, "--wait")
    restored = w.running(copy)
    assert (_node(restored), _marker(restored)) == ("node-2", "counter=5")
    assert _node(w.running(name)) == "node-1"  # the original keeps running


def test_drain_moves_every_selected_pod_off_the_node(world: World) -> None:
    w = world
    group = w.name("drn")
    for i in range(2):
        w.make_pod(f"{group}-{i}", "node-3", marker=f"i={i}", labels={"drain": group})
    out = w.ok("drain", "node-3", "--selector", f"drain={group}", "--repository", REPO,
               "--wait", "--wait-seconds", "120")
    assert "Succeeded" in out, out
    moved = wait_for(lambda: (p := w.running_pods(f"drain={group}")) and len(p) == 2 and p,
                     "both drained pods running")
    assert all(_node(p) != "node-3" for p in moved)
    assert sorted(_marker(p) for p in moved) == ["i=0", "i=1"]
    nodes = w.kube.request("GET", "/api/v1/nodes/node-3")
    w.kube.request("PATCH", "/api/v1/nodes/node-3", {"spec": {"unschedulable": None}},
                   "application/merge-patch+json")  # let the next tests use node-3
    assert nodes["spec"].get("unschedulable") is True


def test_a_target_that_cannot_schedule_rolls_back_to_the_source(world: World,
                                                                 tmp_path: Path) -> None:
    w = world
    name = w.name("rb")
    classes = tmp_path / "classes.yaml"
    classes.write_text(f"classes:\n- name: quick\n  repository: {REPO}\n"
                       "  timeouts:\n    schedule: 3\n    restore: 30\n")
    w.make_pod(name, "node-1", marker="counter=11", labels={"app": name}, cpu="2")
    filler = w.name("filler")
    with w.paused("node-1"):
        op = _id(w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-2", "--class",
                      "quick", "--classes-file", str(classes)))
        w.make_pod(filler, "node-2", cpu="3")  # node-2 (4 CPUs) has no room left for 2
    try:
        assert w.wait_phase(op, "Succeeded", "Failed", "RolledBack", "Cancelled",
                            limit=120) == "RolledBack"
        back = _only_running(w, name)
        assert (_node(back), _marker(back)) == ("node-1", "counter=11")
    finally:
        w.delete_pod(filler)


def test_an_api_server_restart_mid_migration_is_survived(world: World) -> None:
    w = world
    name = w.name("rs")
    w.make_pod(name, "node-1", marker="counter=21", labels={"app": name})
    with w.paused("node-1"):
        op = _id(w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-2",
                      "--repository", REPO))
        w.wait_phase(op, "Checkpointing", "Requested")
        w.restart()  # every watch breaks; resumes meet 410 and relist
    assert w.wait_phase(op, "Succeeded", "Failed", "RolledBack", "Cancelled",
                        limit=120) == "Succeeded"
    moved = _only_running(w, name)
    assert (_node(moved), _marker(moved)) == ("node-2", "counter=21")
