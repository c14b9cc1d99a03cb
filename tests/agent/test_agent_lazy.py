"""A lazy (post-copy) capture the agent cannot perform is refused before anything is
frozen, and the lazy handoff's annotations read back as written (no CRIU here).

Pins docs/protocol.md's "Lazy handoff" refusals: mode ``lazy`` without
``capture-handoff`` (there is no target to hand the workload to), on a dumper without the
lazy capability (the simulator's: stop-and-copy only), on a pod of two containers, and
on a container podman created with plain runc, each naming why; and the protocol's
lazy values: ``report-handoff`` with its page server, ``report-pages``,
``pages-received``. The real transfer is tests/criu/test_agent_lazy.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.machines.contract import protocol
from drivers.agent.criu import CriuDumper
from drivers.agent.dumper import Container, Workload
from drivers.agent.sim import FROZEN
from drivers.podman import PodmanNode
from tests.agent.handoff_world import NS, handoff_value, handoff_world, source
from tests.agent.world import World


def lazy_mode(checkpoint_id: str) -> str:
    return protocol.capture_request(checkpoint_id=checkpoint_id, artifact="", source_uid="",
                                    containers=(), quiesce=False, saver="",
                                    mode=protocol.LAZY)[protocol.CAPTURE_MODE]


async def refused(w: World, checkpoint_id: str, *, handoff: bool) -> str:
    extra = {protocol.CAPTURE_MODE: lazy_mode(checkpoint_id)}
    if handoff:
        extra[protocol.CAPTURE_HANDOFF] = handoff_value(checkpoint_id)
    w.request_capture(NS, "app", checkpoint_id, extra=extra)
    assert await w.report(NS, "app", "Pushed", "Failed", "Transferred") == "Failed"
    assert w.dumpers["node-1"].dumps == 0
    assert FROZEN not in w.annotations(NS, "app")
    assert protocol.REPORT_HANDOFF not in w.annotations(NS, "app")
    return w.annotations(NS, "app")[protocol.REPORT_REASON]


async def test_lazy_without_a_handoff_is_refused_naming_the_missing_target(
        tmp_path: Path) -> None:
    async with handoff_world(tmp_path) as w:
        await source(w)
        reason = await refused(w, "ck-alone", handoff=False)
    assert reason.startswith("Refused: mode 'lazy' hands the workload to another node's")
    assert protocol.CAPTURE_HANDOFF in reason
    assert "nothing was frozen" in reason


async def test_lazy_on_the_sim_dumper_is_refused_as_stop_and_copy_only(
        tmp_path: Path) -> None:
    async with handoff_world(tmp_path) as w:
        await source(w)
        reason = await refused(w, "ck-sim", handoff=True)
    assert reason.startswith("Refused: mode 'lazy' on node node-1: the sim dumper migrates "
                             "by stop-and-copy only")
    assert "nothing was frozen" in reason


class Inspecting(PodmanNode):
    """A node whose ``podman container inspect`` answers with ``runtime`` (no podman)."""

    def __init__(self, root: Path, runtime: str) -> None:
        super().__init__(root)
        self.oci_runtime, self.calls = runtime, list[tuple[str, ...]]()

    async def run(self, *args: str) -> str:
        self.calls.append(args)
        assert args[:2] == ("container", "inspect"), args
        return json.dumps([{"OCIRuntime": self.oci_runtime, "State": {"Status": "running"}}])


def workload(*names: str) -> Workload:
    return Workload(NS, "app", "uid-1", "node-1", tuple(Container(n, "img") for n in names))


async def test_the_criu_dumper_refuses_lazy_for_a_pod_of_two_containers(
        tmp_path: Path) -> None:
    node = Inspecting(tmp_path, "runc")
    why = await CriuDumper(node).refuse_mode("lazy", workload("main", "sidecar"))
    assert why is not None
    assert why.startswith("pod default/app has 2 containers; a lazy migration moves a pod "
                          "of one container")
    assert node.calls == []  # refused before asking podman or CRIU anything


async def test_the_criu_dumper_refuses_lazy_for_a_container_made_with_plain_runc(
        tmp_path: Path) -> None:
    why = await CriuDumper(Inspecting(tmp_path, "runc")).refuse_mode("lazy", workload("main"))
    assert why is not None
    assert "runs under the OCI runtime 'runc', not the lazy runc wrapper" in why


def test_a_lazy_handoff_report_names_its_page_server_and_reads_back() -> None:
    report = protocol.HandoffReport("ck-1", "10.0.0.1:9447", {"main": "sha256:" + "a" * 64},
                                    pages="10.0.0.1:41000")
    read = protocol.handoff_report(report.annotation(), "ck-1")
    assert read == report
    assert protocol.host_port(read.pages) == ("10.0.0.1", 41000)
    plain = protocol.HandoffReport("ck-1", "10.0.0.1:9447", {"main": "sha256:" + "a" * 64})
    assert "pages" not in json.loads(plain.annotation()[protocol.REPORT_HANDOFF])
    assert protocol.handoff_report(plain.annotation(), "ck-1") == plain


@pytest.mark.parametrize("pages", ["nowhere", "host:", ":80", "host:99999", 7])
def test_a_handoff_report_whose_pages_are_not_host_port_is_unreadable(pages: Any) -> None:
    raw = json.dumps({"checkpoint": "ck-1", "address": "h:1", "pages": pages,
                      "archives": {"main": "sha256:" + "a" * 64}})
    with pytest.raises(ValueError, match="report-handoff: pages"):
        protocol.handoff_report({protocol.REPORT_HANDOFF: raw}, "ck-1")


def test_the_pages_annotations_carry_their_checkpoint_and_counts() -> None:
    served = json.loads(protocol.pages_report("ck-1", pages=3, size=12288, seconds=1.23456)[
        protocol.REPORT_PAGES])
    assert served == {"checkpoint": "ck-1", "pages": 3, "bytes": 12288, "seconds": 1.235}
    received = json.loads(protocol.pages_received("ck-1", pages=3, expected=3)[
        protocol.PAGES_RECEIVED])
    assert received == {"checkpoint": "ck-1", "pages": 3, "expected": 3}
    assert protocol.ReportState("Transferred") is protocol.ReportState.TRANSFERRED
