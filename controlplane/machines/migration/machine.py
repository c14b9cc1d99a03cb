"""The ``migration`` machine: move a running pod to another node without losing its state.

One machine, one history; it composes the capture, source, restore and collection steps::

    Checkpointing --ArtifactVerified--> DeletingSource --SourceDeleted--> Restoring
    Restoring --RestoreVerified--> CollectingGarbage --ArtifactDeleted|ArtifactKept-->
        Succeeded | RolledBack | Cancelled
    Restoring --RestoreFailed .. RestoreCleanedUp--> RollingBack (restore on the source
        node) --> ... ; out of attempts --> Failed (artifact preserved)
    (successor: adopt) Checkpointing --ArtifactVerified--> Restoring (beside the source)
        --RestoreVerified--> Adopting --Adopted, SourceDeleted--> CollectingGarbage ...;
        out of restore attempts --AdoptionAbandoned--> WakingInPlace --> Failed
    (transfer: stream) Checkpointing (capture with capture-handoff + restore pod with
        restore-handoff, one decision) --ArtifactVerified--> Restoring (beside the frozen
        source) --RestoreVerified (equal archive-digests)--> DeletingSource
        --SourceDeleted--> CollectingGarbage ...; a streamed restore failing before
        verified --HandoffAbandoned--> WakingInPlace (target pod removed) --> Failed;
        a CRI-O target --StreamDeclined--> the registry path above
    (mode lazy) Checkpointing (capture mode lazy + capture-handoff, and the restore pod
        with restore-handoff, one decision) --RestoreVerified (fresh, restored-from-handoff;
        nothing pushed)--> TargetRunning --PagesTransferred (source Transferred +
        report-pages, target pages-received complete)--> DeletingSource --SourceDeleted-->
        Succeeded (labels handed back; no artifact, no garbage collection); before the
        target runs a failure wakes the source as a stream's does; after it, lost pages
        or the transfer deadline --WorkloadLost--> ClearingLostWorkload (both pods
        removed) --> Failed (WorkloadLost), the source never woken
    Checkpointing --CaptureFailed--> Unsticking (any restore pod removed first) --> Failed
    Checkpointing/DeletingSource --Retarget(source node) | Cancel | abort--> WakingInPlace
        --SourceReleased--> Cancelled | Failed
    CollectingGarbage --GarbageCollectionAbandoned--> GarbageCollectionFailed

Safety: the source is deleted only with a verified artifact that the same observation
still shows, and a clean observation of the source by UID (gates 1, 3, 4); the artifact
is dropped only after a verified restore (gate 2); once the source is gone the restore
must finish somewhere: a failed target restore rolls back to the source node and
``Cancel`` means "restore where it was" (gate 6). ``Succeeded`` is only reported after
garbage collection; a GC that keeps failing ends in ``GarbageCollectionFailed``, never
in a clean success (gate 7). Which node the workload ended on is ``final_node``.

Spec: ``pod`` ``{namespace, name, uid}``, ``source_node``, ``target_node``, ``template``
(the saved pod), optional ``artifact``, ``containers``, ``restore_name``, ``keep_name``,
``successor`` (``adopt``: a ReplicaSet's pod, restored beside its quiesced source and
handed to the ReplicaSet before the source is deleted; ``gated``: a StatefulSet's pod,
restored into the successor its controller recreates, held by a scheduling gate),
``class``.
Commands: ``Retarget`` ``{"node"}``, ``Cancel``. Registered by
:func:`controlplane.machines.catalog.product_kinds`. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from controlplane.engine.commands import CommandSet
from controlplane.engine.decider import (
    CommandLike,
    CommandRejected,
    Decision,
    Event,
    EventLike,
    InvalidSpec,
)
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, Observation
from controlplane.machines.base.codec import decode
from controlplane.machines.base.commands import Cancel, Retarget
from controlplane.machines.base.events import DomainEvent, Started
from controlplane.machines.base.facts import with_facts
from controlplane.machines.base.frozen import replace
from controlplane.machines.base.specs import (
    checkpoint_class,
    node_name,
    object_name,
    only_known,
    optional_flag,
    pod_template,
    require,
)
from controlplane.machines.base.stepping import action_key, started
from controlplane.machines.checkpoint.machine import capture_spec, validate_capture_fields
from controlplane.machines.config.modes import DEFAULT_MODE, MigrationMode, Transfer, parse_mode
from controlplane.machines.contract.actions import EventType, emit_event
from controlplane.machines.migration.events import MigrationCancelRequested, Retargeted
from controlplane.machines.migration.phases import (
    behind_the_cluster,
    decide_migration,
    restore_candidates,
)
from controlplane.machines.migration.state import (
    GATED,
    KIND,
    SUCCESSORS,
    MigrationPhase,
    MigrationSpec,
    MigrationState,
    evolve_migration,
)
from controlplane.machines.stages import restore as rs_

#: The commands a migration machine accepts.
_COMMANDS = CommandSet("migration", Cancel, Retarget)


class MigrationDecider:
    """The ``migration`` kind."""

    kind = KIND

    def validate_spec(self, spec: JsonObject) -> JsonObject:
        only_known(spec, ("pod", "source_node", "target_node", "template", "artifact",
                          "containers", "restore_name", "keep_name", "successor", "class",
                          "keep_checkpoint", "mode"))
        out = validate_capture_fields(spec)
        source = node_name(require(spec, "source_node"), field="spec.source_node")
        target = node_name(require(spec, "target_node"), field="spec.target_node")
        if source == target:
            raise InvalidSpec(f"spec.target_node {target!r} equals spec.source_node: pick "
                              "another node (to stay, do not migrate)")
        name = spec.get("restore_name")
        out.update({
            "source_node": source, "target_node": target,
            "template": pod_template(require(spec, "template"), field="spec.template"),
            "restore_name": None if name is None else object_name(name,
                                                                  field="spec.restore_name"),
        })
        if optional_flag(spec, "keep_checkpoint", meaning="true keeps the checkpoint in the "
                         "registry after the verified restore"):
            out["keep_checkpoint"] = True
        if spec.get("mode") is not None:
            out["mode"] = parse_mode(spec["mode"], field="spec.mode").value
        keep = optional_flag(spec, "keep_name", meaning="true names the restored pod "
                             "restore_name (default: the source's name) once that name is free")
        if keep is not None:
            out["keep_name"] = keep
        successor = spec.get("successor")
        if successor is not None:
            if successor not in SUCCESSORS:
                raise InvalidSpec(f"spec.successor {successor!r} is not 'adopt' or 'gated': "
                                  "'adopt' hands the restored pod to the source's "
                                  "ReplicaSet, 'gated' claims the StatefulSet's successor "
                                  "pod; leave it out for a bare pod")
            if keep is True:
                raise InvalidSpec(f"spec.keep_name and spec.successor {successor!r} exclude "
                                  "each other: the source's controller names the pod")
            out["successor"] = successor
        if successor == GATED and out.get("mode") == MigrationMode.LAZY.value:
            raise InvalidSpec("spec.mode 'lazy' cannot move a StatefulSet's pod: its "
                              "successor takes the source's name, so the source must go "
                              "before the target runs; migrate with mode 'stop-and-copy'")
        return out

    def initial_state(self, machine_id: str, spec: JsonObject) -> MigrationState:
        klass = checkpoint_class(spec.get("class"))
        cspec = capture_spec(machine_id, spec, klass, quiesce=True)
        mode = parse_mode(spec["mode"], field="spec.mode") if spec.get("mode") is not None \
            else klass.migration_mode
        if mode is not DEFAULT_MODE:
            cspec = replace(cspec, mode=mode.value)
        template = spec["template"]
        assert isinstance(template, dict)
        name = spec.get("restore_name")
        successor = str(spec.get("successor") or "")
        # Streamed only where the source can stay until the target is verified: not a
        # StatefulSet's successor (same name: the source must go first), not precopy.
        # Decided here, from the spec and class alone, so replay chooses the same path;
        # a CRI-O target is declined at the first decision (StreamDeclined, recorded).
        stream = klass.transfer is Transfer.STREAM and mode is DEFAULT_MODE and \
            successor != GATED
        # Lazy is always handed off (nothing is pushed), whatever the class's transfer.
        lazy = mode is MigrationMode.LAZY and successor != GATED
        mspec = MigrationSpec(cspec, str(spec["source_node"]), template,
                              name if isinstance(name, str) else cspec.name,
                              # a restored pod cannot take the name the source still holds
                              keep_name=spec.get("keep_name") is True and not stream
                              and not lazy,
                              keep_checkpoint=spec.get("keep_checkpoint") is True,
                              successor=successor, stream=stream, lazy=lazy)
        return MigrationState(machine_id, mspec, klass, target=str(spec["target_node"]))

    def interests(self, state: MigrationState) -> Interests:
        source = frozenset({state.spec.capture.pod_key})
        s = state.status
        if state.terminal:
            return Interests()
        # The artifact's tag is asked for by the decision that needs it (needs_tags): a
        # wake while the agent works or the source goes needs only the pod.
        r = state.restore
        if s is MigrationPhase.CHECKPOINTING and state.streams:
            if r is None:  # which runtime the target runs decides whether it streams
                return Interests(pods=source, nodes=frozenset({state.target}))
            nodes = frozenset({r.plan.node}) if r.plan.node else frozenset()
            return Interests(pods=source | {r.plan.key}, nodes=nodes)
        if s in (MigrationPhase.TARGET_RUNNING, MigrationPhase.CLEARING_LOST) and \
                r is not None:
            return Interests(pods=source | {r.plan.key})  # (lazy) the pages, both ends
        if s in (MigrationPhase.UNSTICKING, MigrationPhase.WAKING_IN_PLACE) and \
                r is not None and r.status not in (rs_.RestoreStatus.CLEANED,
                                                   rs_.RestoreStatus.VERIFIED):
            return Interests(pods=source | {r.plan.key})  # its pod is removed first
        if behind_the_cluster(state):  # where a restore of it would be, if it ran
            return Interests(pods=source | restore_candidates(state))
        if s in (MigrationPhase.CHECKPOINTING, MigrationPhase.UNSTICKING,
                 MigrationPhase.WAKING_IN_PLACE, MigrationPhase.DELETING_SOURCE):
            return Interests(pods=source)
        if s is MigrationPhase.COLLECTING_GARBAGE:
            return Interests()
        if s is MigrationPhase.ADOPTING:
            assert state.restore is not None
            return Interests(pods=source | {state.restore.plan.key})
        if r is None or r.status is rs_.RestoreStatus.CLEANED:
            # The next attempt's node (the target, or the source for a rollback): which
            # runtime it runs decides how it restores (rs_.runtime_plan).
            nodes = frozenset({state.target, state.spec.source_node})
            if state.spec.keep_name:  # is the name free yet?
                return Interests(pods=frozenset({state.spec.name_key}), nodes=nodes)
            return Interests(nodes=nodes)
        nodes = frozenset({r.plan.node}) if r.plan.node and r.in_flight else frozenset()
        return Interests(pods=frozenset({r.plan.key}), nodes=nodes)

    def decide(self, state: MigrationState, observation: Observation, now: datetime) -> Decision:
        if state.terminal:
            return Decision()
        if state.started_at is None:
            c = state.spec.capture
            notice = emit_event(action_key(state.machine_id, "event", "started"),
                                namespace=c.namespace, pod_name=c.name, pod_uid=c.uid,
                                type_=EventType.NORMAL, reason="MigrationStarted",
                                message=f"moving from {state.spec.source_node} to "
                                f"{state.target} (operation {state.machine_id})")
            return started(self, state, Started(at=now, kind=KIND, target=state.target),
                           observation, now, actions=[notice])
        return with_facts(decide_migration(state, observation, now).decision(), observation)

    def evolve(self, state: MigrationState, event: EventLike | DomainEvent) -> MigrationState:
        return evolve_migration(state, event)

    def accept(self, state: MigrationState, command: CommandLike,
               now: datetime) -> Sequence[Event]:
        typed_command = _COMMANDS.decode(command)
        if state.terminal:
            raise CommandRejected(f"migration {state.machine_id} is already {state.phase}")
        if state.target_ran:
            raise CommandRejected(
                f"migration {state.machine_id} is lazy and its target runs on "
                f"{state.target}: the source's memory is moving there page by page and "
                "cannot be woken any more; wait for the pages (or for the migration to "
                "report the workload lost)")
        restored = state.restore is not None and \
            state.restore.status is rs_.RestoreStatus.VERIFIED
        if state.status in (MigrationPhase.COLLECTING_GARBAGE, MigrationPhase.ADOPTING) or \
                restored:
            raise CommandRejected(f"migration {state.machine_id} already restored the workload "
                                  f"on {state.target}; start a new migration to move it")
        ending = state.status in (MigrationPhase.UNSTICKING, MigrationPhase.WAKING_IN_PLACE)
        facts: JsonObject = {"command": typed_command.type}
        match typed_command:
            case Cancel():
                if ending or state.cancelled:
                    return ()
                return (MigrationCancelRequested(
                    at=now, before_deletion=not state.deletion_requested).recorded(facts),)
            case Retarget(node=asked):
                try:
                    node = node_name(asked, field="node")
                except InvalidSpec as err:
                    raise CommandRejected(str(err)) from None
            case _:
                raise AssertionError(f"{typed_command!r} is in the migration's command set")
        if ending:
            raise CommandRejected(f"migration {state.machine_id} is {state.phase}: it is "
                                  "ending; submit a new migration")
        if node == state.target:
            return ()
        wake = node == state.spec.source_node and not state.deletion_requested
        if state.streams and not state.source_gone and not wake:
            raise CommandRejected(f"migration {state.machine_id} streams its checkpoint to "
                                  f"{state.target}: cancel it and migrate again to move the "
                                  "pod elsewhere")
        return (Retargeted(at=now, node=node, previous=state.target,
                           wake_in_place=wake).recorded(facts),)

    def load_state(self, data: JsonObject) -> MigrationState:
        return decode(MigrationState, data)


__all__ = ["KIND", "MigrationDecider", "MigrationPhase", "MigrationState"]
