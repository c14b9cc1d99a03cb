"""A runtime-backed pod's status follows its real containers (the kubelet's PLEG rules)."""

from __future__ import annotations

from drivers.kubelet.containers import changed, pod_status
from drivers.podman.podman import ContainerState, container_name, parse_name
from drivers.sim.objects import Obj, condition

POD: Obj = {"metadata": {"namespace": "default", "name": "app", "uid": "u-1"},
            "spec": {"containers": [{"name": "main", "image": "img"},
                                    {"name": "side", "image": "img"}]},
            "status": {"phase": "Running", "conditions": []}}


def state(status: str, *, exit_code: int = 0, checkpointed: bool = False) -> ContainerState:
    return ContainerState("k8s_main_app_default_u-1", "c0ffee", status, exit_code,
                          "2026-11-25T00:00:00Z", "", checkpointed, "img", "sha256:1")


def _ready(fields: Obj) -> str:
    found = condition({"status": fields}, "Ready")
    assert found is not None
    return str(found["status"])


def test_all_running_containers_make_a_ready_running_pod() -> None:
    fields = pod_status(POD, {"main": state("running"), "side": state("running")})
    assert fields["phase"] == "Running"
    assert _ready(fields) == "True"
    assert [c["containerID"] for c in fields["containerStatuses"]] == ["podman://c0ffee"] * 2


def test_a_checkpoint_stopped_container_holds_the_pod_running_but_not_ready() -> None:
    fields = pod_status(POD, {"main": state("exited", checkpointed=True),
                              "side": state("running")})
    assert fields["phase"] == "Running"
    assert _ready(fields) == "False"
    assert fields["containerStatuses"][0]["state"]["waiting"]["reason"] == "Checkpointed"


def test_containers_that_exited_on_their_own_end_the_pod_by_exit_code() -> None:
    done = {"main": state("exited"), "side": state("exited")}
    assert pod_status(POD, done)["phase"] == "Succeeded"
    failed = {"main": state("exited"), "side": state("exited", exit_code=137)}
    fields = pod_status(POD, failed)
    assert fields["phase"] == "Failed"
    assert fields["containerStatuses"][1]["state"]["terminated"]["reason"] == "Error"


def test_a_container_not_created_yet_is_waiting_and_the_pod_not_ready() -> None:
    fields = pod_status(POD, {"main": state("running"), "side": None})
    assert fields["phase"] == "Running"
    assert fields["containerStatuses"][1]["state"]["waiting"]["reason"] == "ContainerCreating"
    assert _ready(fields) == "False"


def test_an_unchanged_status_is_not_written_again() -> None:
    fields = pod_status(POD, {"main": state("running"), "side": state("running")})
    assert changed(POD, fields)
    assert not changed({**POD, "status": fields}, fields)
    stopped = pod_status(POD, {"main": state("exited", checkpointed=True),
                               "side": state("running")})
    assert changed({**POD, "status": fields}, stopped)


def test_a_runtime_container_name_says_which_pod_it_belongs_to() -> None:
    name = container_name("default", "web-0", "a1b2", "main")
    owner = parse_name(name)
    assert owner is not None
    assert (owner.namespace, owner.pod, owner.uid, owner.container) == (
        "default", "web-0", "a1b2", "main")
    assert parse_name("someone-elses-container") is None
