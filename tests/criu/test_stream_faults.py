"""A streamed migration (``transfer: stream``, real CRIU) survives SIGKILL of the worker and
of either agent at each step, with the outcome docs/protocol.md ("Handoff") states.

The steps are held open by what the test controls, never by timing: an agent stopped
(``SIGSTOP``) before it acts, and the registry copy held mid-push by the world's relay
(the class ``streamed-relayed``). A killed process is started again, as a DaemonSet or a
Deployment would. Each test proves one workload runs at the end, the right one: the
restored or the thawed counter counts on from its checkpoint with no count repeated,
and while the migration ran no moment showed it running on both nodes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane.machines.contract import protocol
from tests.criu.faults import TwoCopies, counts_on_in_place, history_of, moved, ticking
from tests.criu.world import CriuWorld, open_criu_world
from tests.e2e.world import Obj
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CriuWorld]:
    with open_criu_world(tmp_path_factory.mktemp("criu-faults")) as w:
        yield w


def _migrate(w: CriuWorld, name: str) -> str:
    """Start a streamed migration (registry copy through the relay); its operation id."""
    out = w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-2",
               *w.streamed(relayed=True))
    return out.split()[0]


def _target(w: CriuWorld, name: str) -> Obj | None:
    """The restore pod the migration created for ``name`` (its labels are parked)."""
    for pod in w.kube.pods(w.namespace):
        asked = protocol.restore_handoff(pod["metadata"].get("annotations") or {})
        if asked is not None and (asked.namespace, asked.name) == (w.namespace, name):
            return pod
    return None


def _notes(w: CriuWorld, name: str) -> dict[str, str]:
    pod = w.kube.pod(w.namespace, name)
    return dict((pod or {}).get("metadata", {}).get("annotations") or {})


def _offered(w: CriuWorld, name: str) -> dict[str, str] | None:
    notes = _notes(w, name)
    return notes if protocol.REPORT_HANDOFF in notes else None


def _restored_on_target(w: CriuWorld, name: str) -> Obj | None:
    pod = _target(w, name)
    notes = (pod or {}).get("metadata", {}).get("annotations") or {}
    return pod if protocol.RESTORED_FROM_HANDOFF in notes else None


def _recorded(w: CriuWorld, operation: str, event: str) -> bool:
    return any(e["type"] == event for e in history_of(w, operation))


def _await_phase(w: CriuWorld, operation: str, *phases: str) -> str:
    return w.wait_phase(operation, *phases, limit=180)


def test_a_worker_killed_at_each_step_of_a_streamed_migration_finishes_it_once(
        world: CriuWorld) -> None:
    """Killed once the capture is asked (the source agent held) and once the target runs
    restored (the registry copy held mid-push): the next worker takes the migration
    over from the history and it ends as it would have, each step recorded once."""
    w = world
    assert w.relay is not None
    name = w.name("wkill")
    source, before = ticking(w, name)
    with TwoCopies(w, name) as copies:
        with w.paused("node-1"):
            operation = _migrate(w, name)
            wait_for(lambda: (_target(w, name) is not None
                              and protocol.CAPTURE_HANDOFF in _notes(w, name)) or None,
                     "the capture asked and the target pod created")
            w.kill("worker")
            w.start_worker()
            w.relay.hold()
        try:
            wait_for(lambda: _restored_on_target(w, name), "the target restored", 120)
            assert w.relay.held > 0, "the push was not held: the step was not isolated"
            w.kill("worker")
            w.start_worker()
        finally:
            w.relay.release()
        assert _await_phase(w, operation, "Succeeded", "Failed") == "Succeeded"
    assert copies.both == []
    types = [e["type"] for e in history_of(w, operation)]
    for once in ("RestoreVerified", "ArtifactVerified", "SourceDeleted"):
        assert types.count(once) == 1, types
    moved(w, name, source, before)


def test_a_source_agent_killed_before_the_target_fetched_thaws_the_source_in_place(
        world: CriuWorld) -> None:
    """The source agent dumped, offered and is pushing; the target's agent has not
    fetched (held). Killed: its offer dies with it; the next agent neither captures
    again nor wakes the workload (it cannot know the target did not fetch): ``Failed:
    AgentRestarted``, held until the control plane removed the target pod and withdrew
    the request. Then the same process counts on where it was."""
    w = world
    assert w.relay is not None
    name = w.name("skill")
    source, before = ticking(w, name)
    with TwoCopies(w, name) as copies:
        w.relay.hold()
        try:
            with w.paused("node-2"):
                operation = _migrate(w, name)
                wait_for(lambda: _offered(w, name), "the source agent's offer", 120)
                w.kill("agent-node-1")
                w.start_agent("node-1")
                # The target's agent stays held until the restarted source agent's report
                # is recorded: resumed earlier, it would find the dead offer first (its
                # restore fails, and the source is woken by that other, also safe, path).
                wait_for(lambda: _recorded(w, operation, "CaptureFailed"),
                         "the restarted source agent's report recorded", 120, every=0.2)
        finally:
            w.relay.release()
        assert _await_phase(w, operation, "Succeeded", "Failed") == "Failed"
    assert copies.both == []
    history = history_of(w, operation)
    [failed] = [e["data"] for e in history if e["type"] == "CaptureFailed"]
    assert "reported: AgentRestarted: the agent on node-1 restarted" in failed["message"], \
        failed
    counts_on_in_place(w, name, source, before)
    assert _target(w, name) is None  # the target pod was removed


def test_a_source_agent_killed_after_the_target_restored_never_runs_two_copies(
        world: CriuWorld) -> None:
    """The target runs the stream's checkpoint; the registry copy is still mid-push when
    the source agent dies. The target cannot be trusted (gate 1: no verified artifact),
    and the source must not wake beside it: the next agent holds the workload
    (``AgentRestarted``), the control plane removes the target pod first, then
    withdraws, and the source thaws in place."""
    w = world
    assert w.relay is not None
    name = w.name("sdead")
    source, before = ticking(w, name)
    with TwoCopies(w, name) as copies:
        w.relay.hold()
        try:
            operation = _migrate(w, name)
            wait_for(lambda: _restored_on_target(w, name), "the target restored", 120)
            w.kill("agent-node-1")
            w.start_agent("node-1")
        finally:
            w.relay.release()
        assert _await_phase(w, operation, "Succeeded", "Failed") == "Failed"
    assert copies.both == []
    types = [e["type"] for e in history_of(w, operation)]
    assert "RestoreVerified" not in types, types
    assert "SourceDeleted" not in types, types
    counts_on_in_place(w, name, source, before)
    assert _target(w, name) is None  # the target pod was removed


def test_a_target_agent_killed_before_it_fetched_restores_once_started_again(
        world: CriuWorld) -> None:
    """The target's agent dies with the offer open and unfetched; the next one reads the
    offer from the source pod, fetches and restores: the migration succeeds."""
    w = world
    name = w.name("tkill")
    source, before = ticking(w, name)
    with TwoCopies(w, name) as copies:
        with w.paused("node-2"):
            operation = _migrate(w, name)
            wait_for(lambda: _offered(w, name), "the source agent's offer", 120)
            w.kill("agent-node-2")
        w.start_agent("node-2")
        assert _await_phase(w, operation, "Succeeded", "Failed") == "Succeeded"
    assert copies.both == []
    moved(w, name, source, before)


def _handed_off(w: CriuWorld, name: str) -> str | None:
    """The checkpoint id once the source agent logged the target's acknowledgement."""
    checkpoint = _notes(w, name).get(protocol.CAPTURE_CHECKPOINT_ID)
    log = (w.tmp / "agent-node-1.stdout").read_text(errors="replace")
    return checkpoint if checkpoint and any(
        "checkpoint handed off" in line and checkpoint in line
        for line in log.splitlines()) else None


def test_a_target_agent_killed_after_it_took_the_stream_fetches_it_again_while_offered(
        world: CriuWorld) -> None:
    """The target's agent acknowledged the whole stream, then dies (in its restore, or
    just after): while the source's job still runs (its registry copy held mid-push),
    the offer stays open to that node, and the next agent fetches it again and restores
    it (a container the dying one restored is kept): the migration succeeds, once."""
    w = world
    assert w.relay is not None
    name = w.name("tagain")
    source, before = ticking(w, name)
    with TwoCopies(w, name) as copies:
        w.relay.hold()  # the registry copy cannot end: the offer stays open
        try:
            operation = _migrate(w, name)
            wait_for(lambda: _handed_off(w, name), "the target to acknowledge the stream")
            w.kill("agent-node-2")
            w.start_agent("node-2")
            wait_for(lambda: _restored_on_target(w, name), "the target restored", 120)
        finally:
            w.relay.release()
        assert _await_phase(w, operation, "Succeeded", "Failed") == "Succeeded"
    assert copies.both == []
    moved(w, name, source, before)


def test_a_target_agent_killed_after_the_offer_closed_rolls_back_to_the_source(
        world: CriuWorld) -> None:
    """The target's agent acknowledged the stream and the push ended, which closes the
    offer (delivered); the agent dies before it marked its pod. The next one's fetch is
    refused, its restore fails, the control plane removes the target pod — waiting until
    the node stopped its containers, whatever the dying agent restored — and only then
    withdraws the request: the source thaws in place. (Had the dying agent marked the
    pod first, the migration succeeds: which one happened is read from the pod at the
    kill, and that outcome is asserted.)"""
    w = world
    name = w.name("tdead")
    source, before = ticking(w, name)
    with TwoCopies(w, name) as copies:
        operation = _migrate(w, name)
        wait_for(lambda: (_handed_off(w, name) and _notes(w, name).get(
            protocol.REPORT_STATE) == "Pushed") or None, "the stream taken and the push ended")
        w.kill("agent-node-2")
        marked = _restored_on_target(w, name) is not None
        print(f"target agent killed after the offer closed; its pod marked: {marked}")
        w.start_agent("node-2")
        phase = _await_phase(w, operation, "Succeeded", "Failed")
    assert copies.both == []
    if marked:  # restored and marked before the kill: nothing was lost
        assert phase == "Succeeded"
        moved(w, name, source, before)
        return
    assert phase == "Failed"
    history = history_of(w, operation)
    [abandoned] = [e["data"] for e in history if e["type"] == "HandoffAbandoned"]
    assert "withdrawn by the source agent: delivered" in abandoned["message"], abandoned
    counts_on_in_place(w, name, source, before)
    assert _target(w, name) is None  # the target pod was removed
