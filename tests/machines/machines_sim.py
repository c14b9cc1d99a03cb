"""A tiny simulated cluster, registry and node agent to drive machines under faults.

:class:`Run` plays the engine: it observes the :class:`World` through the machine's
interests, decides, appends events, performs (or fails, drops, duplicates) the actions,
and re-decides until idle, checking the safety invariants on every decision:

- the source is deleted only while the registry holds a manifest with this checkpoint's
  provenance, after ``ArtifactVerified`` (gate 1); a kill only after ``CaptureFailed``;
- a manifest is deleted only after ``RestoreVerified`` of that digest (gate 2);
- a restored pod is created only once the source is gone (never two live copies);
- a decision taken on an observation holding a ``ProbeError`` is never destructive
  (source delete, manifest delete, cold boot) (gate 3);
- ``decide`` is deterministic, also after a JSON round trip of its inputs; terminal
  states decide nothing; idle machines wake in the future; ``load_state`` inverts
  ``to_json``; replaying the history reproduces the state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from controlplane.engine.commands import RecordedCommand
from controlplane.engine.decider import (
    Action,
    CommandRejected,
    Decider,
    Event,
    fold,
)
from controlplane.engine.events import ActionFailed
from controlplane.engine.observation import (
    Interests,
    NodeView,
    Observation,
    PodView,
    ProbeError,
    TagView,
)
from controlplane.machines.base.commands import Cancel
from controlplane.machines.contract import protocol
from tests.machines.machines_gwt import T0, check_contract, digest_of, manifest

DESTRUCTIVE = ("/source/delete/", "/source/kill/")


@dataclass
class World:
    pods: dict[str, PodView]
    tags: dict[str, TagView] = field(default_factory=dict)
    nodes: dict[str, NodeView] = field(default_factory=dict)
    now: datetime = T0
    seq: int = 0
    targets: dict[str, str | None] = field(default_factory=dict)
    probe: frozenset[str] = frozenset()  # which probes fail next: pods, tags, nodes

    def next(self) -> int:
        self.seq += 1
        return self.seq

    def observe(self, interests: Interests) -> Observation:
        err = ProbeError("ServiceUnavailable", "injected probe failure")
        return Observation(
            pods={k: err if "pods" in self.probe else self.pods.get(k) for k in interests.pods},
            tags={k: err if "tags" in self.probe else self.tags.get(k) for k in interests.tags},
            nodes={k: err if "nodes" in self.probe else self.nodes.get(k)
                   for k in interests.nodes})

    # --- the worker's actions --------------------------------------------------------
    def perform(self, action: Action) -> None:
        p = action.params
        key = f"{p.get('namespace')}/{p.get('name')}"
        pod = self.pods.get(key)
        if action.type == "AnnotatePod" and pod and pod.uid == p["uid"] and not pod.deleting:
            ann = p["annotations"]
            assert isinstance(ann, dict)
            self.pods[key] = replace(pod, annotations={**pod.annotations,
                                                       **{k: str(v) for k, v in ann.items()}})
        elif action.type == "RemovePodAnnotations" and pod and pod.uid == p["uid"]:
            keys = p["keys"]
            assert isinstance(keys, list)
            self.pods[key] = replace(pod, annotations={k: v for k, v in pod.annotations.items()
                                                       if k not in keys})
        elif action.type == "DeletePod" and pod and pod.uid == p["uid"]:
            self.pods[key] = replace(pod, deleting=True)
        elif action.type == "CreatePod" and pod is None:
            ann = p["annotations"]
            assert isinstance(ann, dict)
            self.pods[key] = PodView(str(p["namespace"]), str(p["name"]), f"uid-{self.next()}",
                                     None, "Pending",
                                     annotations={k: str(v) for k, v in ann.items()})
            node = p["node"]
            self.targets[key] = node if isinstance(node, str) else None
        elif action.type == "DeleteManifest":
            self.tags = {r: t for r, t in self.tags.items()
                         if not (t.digest == p["digest"] and r.startswith(str(p["repository"])))}

    # --- the node agent and the cluster ----------------------------------------------
    def agent_capture(self, mode: str) -> None:
        for key, pod in list(self.pods.items()):
            cid = pod.annotations.get(protocol.CAPTURE_CHECKPOINT_ID)
            if cid is None or pod.deleting:
                continue
            art = pod.annotations[protocol.CAPTURE_ARTIFACT]
            reported = pod.annotations.get(protocol.REPORT_CHECKPOINT_ID) == cid
            digest = digest_of(f"{cid}/{pod.uid}/{self.next()}")
            report: dict[str, str] = {}
            if mode in ("push", "push_silent", "late_tag") and (not reported or
                                                               mode == "late_tag"):
                self.push(art, digest, cid, pod.uid, pod.node or "")
                report = {protocol.REPORT_STATE: "Pushed", protocol.REPORT_DIGEST: digest}
            elif mode == "report_only" and not reported:
                report = {protocol.REPORT_STATE: "Pushed", protocol.REPORT_DIGEST: digest}
            elif mode == "fail" and not reported:
                report = {protocol.REPORT_STATE: "Failed", protocol.REPORT_REASON: "criu"}
            elif mode == "stale":
                self.push(art, digest, "some-older-checkpoint", pod.uid, pod.node or "")
            if report and mode != "push_silent":
                report[protocol.REPORT_CHECKPOINT_ID] = cid
                self.pods[key] = replace(pod, annotations={**pod.annotations, **report})

    def push(self, art: str, digest: str, cid: str, uid: str, node: str) -> None:
        repo = art.rsplit(":", 1)[0]
        self.tags[art] = manifest(art, digest, checkpoint_id=cid, uid=uid, node=node)
        self.tags[f"{repo}@{digest}"] = manifest(f"{repo}@{digest}", digest, checkpoint_id=cid,
                                                 uid=uid, node=node)

    def agent_restore(self, mode: str) -> None:
        for key, pod in list(self.pods.items()):
            if protocol.RESTORE_KEY not in pod.annotations or pod.phase != "Pending" \
                    or pod.deleting:
                continue
            target = self.targets.get(key) or "n1"
            n = self.nodes.get(target)
            if n is None or not n.ready or n.unschedulable:
                continue
            artifact = pod.annotations.get(protocol.RESTORE_ARTIFACT)
            ann = dict(pod.annotations)
            phase = "Running"
            if mode == "fail":
                ann[protocol.RESTORE_FAILURE] = "restore failed"
                phase = "Failed"
            elif mode == "bind_only":
                phase = "Pending"
            elif artifact is not None:
                ann[protocol.RESTORED_FROM_DIGEST] = artifact.split("@", 1)[1]
                ann[protocol.INSTANCE_ID] = ("inst-src" if mode == "stale_identity"
                                             else f"inst-{self.next()}")
            self.pods[key] = replace(pod, node=target, phase=phase, annotations=ann)

    def reap(self) -> None:
        self.pods = {k: p for k, p in self.pods.items() if not p.deleting}


@dataclass
class Faults:
    fail_actions: bool = False
    drop_actions: bool = False
    discard: bool = False
    duplicate: bool = False
    forbidden: frozenset[str] = frozenset()  # action types that always fail (e.g. RBAC 403)


@dataclass
class Run:
    decider: Decider[Any]
    machine_id: str
    spec: dict[str, Any]
    world: World
    source_uid: str | None = None
    state: Any = None
    history: list[Event] = field(default_factory=list)
    faults: Faults = field(default_factory=Faults)

    def __post_init__(self) -> None:
        self.spec = self.decider.validate_spec(self.spec)
        self.state = self.decider.initial_state(self.machine_id, self.spec)

    def apply(self, event: Event) -> None:
        json.dumps(event.data)
        json.dumps(event.facts)
        self.state = self.decider.evolve(self.state, event)
        self.history.append(event)
        assert self.decider.load_state(self.state.to_json()) == self.state

    def command(self, type_: str, **data: Any) -> None:
        try:
            events = self.decider.accept(self.state, RecordedCommand(type_, data), self.world.now)
        except CommandRejected:
            return
        for event in events:
            self.apply(event)

    def step(self) -> datetime | None:
        """Decide until idle (the engine's rule), performing actions between decisions."""
        for _ in range(40):
            obs = self.world.observe(self.decider.interests(self.state))
            decision = self.decider.decide(self.state, obs, self.world.now)
            check_contract(self.decider, self.state, obs, self.world.now, decision)
            for _ in range(2):  # the worker's rule: look up the tags it needs, decide again
                if not decision.needs_tags:
                    break
                looked = self.world.observe(Interests(tags=decision.needs_tags))
                obs = replace(obs, tags={**obs.tags, **looked.tags})
                decision = self.decider.decide(self.state, obs, self.world.now)
                check_contract(self.decider, self.state, obs, self.world.now, decision)
            assert not decision.needs_tags, "a decision asked for tags twice"
            self.check_safety(obs, decision.actions, decision.events)
            if self.faults.discard:  # crash before the commit: nothing happened
                self.faults.discard = False
                continue
            for event in decision.events:
                self.apply(event)
            self.perform(decision.actions)
            if decision.idle:
                return decision.wake_at
        raise AssertionError(f"no idle decision on a fixed world (phase {self.state.phase})")

    def perform(self, actions: tuple[Action, ...]) -> None:
        real = [a for a in actions if a.type != "EmitEvent"]
        refused = [a for a in real if a.type in self.faults.forbidden]
        if refused:
            self.fail(refused)
            real = [a for a in real if a not in refused]
            actions = tuple(a for a in actions if a not in refused)
        if real and self.faults.drop_actions:  # crash after the commit: actions lost
            self.faults.drop_actions = False
            return
        if real and self.faults.fail_actions:
            self.faults.fail_actions = False
            self.fail(real)
            return
        for a in actions:
            self.world.perform(a)
            if self.faults.duplicate:
                self.world.perform(a)

    def fail(self, actions: list[Action]) -> None:
        for a in actions:
            self.apply(ActionFailed(action=a.type, key=a.key, error_class="Forbidden",
                                    message="403 Forbidden", retryable=False,
                                    attempts=3).recorded())

    def check_safety(self, obs: Observation, actions: tuple[Action, ...],
                     events: tuple[Event, ...]) -> None:
        seen = [*self.history, *events]
        types = {e.type for e in seen}
        probe_error = any(isinstance(v, ProbeError) for v in
                          [*obs.pods.values(), *obs.tags.values(), *obs.nodes.values()])
        observed = bool(obs.pods or obs.tags or obs.nodes)
        for e in events:
            assert e.facts or not observed, f"{e.type} carries no facts"
            if e.type == "ArtifactVerified":  # justified by the facts it records (gate 1)
                ann = e.facts["tag_annotations"]
                assert isinstance(ann, dict)
                assert ann[protocol.MANIFEST_CHECKPOINT_ID] == self.machine_id
                assert ann[protocol.MANIFEST_SOURCE_POD_UID] == self.source_uid
            if e.type == "RestoreVerified":  # gate 2's proof, from the facts of the pod
                assert e.facts["pod_phase"] == "Running"
        for a in actions:
            p = a.params
            source_delete = a.type == "DeletePod" and p.get("uid") == self.source_uid and \
                any(s in a.key for s in DESTRUCTIVE)
            cold_boot = a.type == "CreatePod" and protocol.RESTORE_ARTIFACT not in \
                dict(p["annotations"])  # type: ignore[arg-type]
            if probe_error:
                assert not source_delete, f"source deleted on a probe error: {a}"
                assert a.type != "DeleteManifest", f"manifest deleted on a probe error: {a}"
                assert not cold_boot, f"cold boot on a probe error: {a}"
            if source_delete and "/source/delete/" in a.key:
                assert "ArtifactVerified" in types
                assert any(t.annotations.get(protocol.MANIFEST_CHECKPOINT_ID) ==
                           self.machine_id and t.annotations.get(
                               protocol.MANIFEST_SOURCE_POD_UID) == self.source_uid
                           for t in self.world.tags.values()), "source deleted, no artifact"
            if source_delete and "/source/kill/" in a.key:
                assert "CaptureFailed" in types
            if a.type == "DeleteManifest":
                verified = [e for e in seen if e.type == "RestoreVerified"]
                assert verified, "artifact dropped before a verified restore"
                assert verified[-1].data["digest"] == p["digest"]
            if a.type == "CreatePod" and self.source_uid is not None:
                assert types & {"SourceDeleted", "SourceVanished"}, "restored beside the source"
            if cold_boot:
                assert "ColdBootChosen" in types

    def settle(self, rounds: int = 80) -> None:
        """Stop the faults, let the world cooperate and time pass: the machine must end."""
        self.faults = Faults(forbidden=self.faults.forbidden)
        self.world.probe = frozenset()
        for _ in range(rounds):
            if self.state.terminal:
                return
            self.world.nodes = {k: replace(n, unschedulable=False, ready=True)
                                for k, n in self.world.nodes.items()}
            self.world.agent_capture("push")
            self.world.agent_restore("ok")
            self.world.reap()
            wake = self.step()
            if self.state.terminal:
                return
            later = self.world.now + timedelta(seconds=1)
            self.world.now = max(later, wake) if wake else later
        raise AssertionError(f"machine never finished (phase {self.state.phase})")

    def check_replay(self) -> None:
        initial = self.decider.initial_state(self.machine_id, self.spec)
        assert fold(self.decider, initial, self.history) == self.state
        wire = [Event(e.type, json.loads(json.dumps(e.data)), json.loads(json.dumps(e.facts)))
                for e in self.history]
        assert fold(self.decider, initial, wire) == self.state
        if self.state.terminal:
            late = ActionFailed(action="DeletePod", key="late", message="x",
                                error_class="Conflict", retryable=False).recorded()
            assert self.decider.evolve(self.state, late) == self.state
            try:
                self.decider.accept(self.state, Cancel(), self.world.now)
            except CommandRejected:
                pass
            else:
                raise AssertionError("a terminal machine accepted a command")


def play(run: Run, ops: list[tuple[str, Any]], *, source_key: str | None = None) -> None:
    """Apply a random script of world changes and faults, stepping the machine after each."""
    w = run.world
    for name, arg in ops:
        w.probe = frozenset()
        if name == "progress":
            w.agent_capture("push")
            w.agent_restore("ok")
            w.reap()
        elif name == "advance":
            w.now += timedelta(seconds=arg)
        elif name == "agent":
            w.agent_capture(arg)
        elif name == "restore_agent":
            w.agent_restore(arg)
        elif name == "reap":
            w.reap()
        elif name == "vanish" and source_key:
            w.pods.pop(source_key, None)
        elif name == "recreate" and source_key:
            w.pods[source_key] = PodView(*source_key.split("/"), uid=f"uid-{w.next()}",
                                         node="n1", phase="Running")
        elif name == "vanish_restored":
            w.pods = {k: p for k, p in w.pods.items() if protocol.RESTORE_KEY not in
                      p.annotations}
        elif name == "lose_artifact":
            w.tags = {}
        elif name == "cordon":
            w.nodes[arg] = replace(w.nodes[arg], unschedulable=True)
        elif name == "probe":  # the world moves on while our probes fail
            w.agent_capture("push")
            w.agent_restore("ok")
            w.probe = frozenset(arg)
        elif name in ("fail_actions", "drop_actions", "discard", "duplicate"):
            setattr(run.faults, name, True)
        elif name == "retarget":
            run.command("Retarget", node=arg)
        elif name == "cancel":
            run.command("Cancel")
        if run.state.terminal:
            run.step()
            continue
        run.step()
        run.faults.duplicate = False
