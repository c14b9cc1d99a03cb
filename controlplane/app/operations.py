"""Submitting machines and sending them commands: the write path for operators.

Validation is the decider's (``validate_spec``, ``accept``), so a bad spec or a refused
command is a one-line :class:`UsageError` naming the field, and nothing is written. A
command is appended with the same optimistic check as a worker's decision and wakes the
machine; if a worker commits first, the command is re-evaluated on the fresh state.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from controlplane.engine.decider import Command, CommandRejected, InvalidSpec, fold
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.kinds import KindRegistry, UnknownKind
from controlplane.engine.observation import Observation, PodView, pod_key
from controlplane.errors import ControlPlaneError, UsageError
from controlplane.machines.base.events import WakeRequested
from controlplane.machines.submission import (
    ActiveOperation,
    Limits,
    OperationRequest,
    Queue,
    Reject,
    SubmissionUnverifiable,
    admission_from_counts,
    submission_interests,
    validate_submission,
)
from controlplane.store import event_store, leases, queries
from controlplane.store.admission import AdmissionFacts
from controlplane.store.database import Database
from controlplane.store.errors import ConcurrencyConflict, WorkloadBusy
from controlplane.store.records import MachineRecord, Projection
from controlplane.worker.ports import Observer

OPERATOR = "operator"


#: The longest machine id (the ``machines.id`` column's size).
MAX_MACHINE_ID = 64


async def submit(
    db: Database,
    kinds: KindRegistry,
    *,
    kind: str,
    spec: JsonObject,
    machine_id: str,
    now: datetime,
    requester: str = OPERATOR,
) -> str:
    """Validate ``spec`` and create the machine, due at once; return its id.
    ``requester``: who asked (:mod:`controlplane.app.requester`), recorded with it."""
    try:
        decider = kinds.get(kind)
    except UnknownKind as exc:
        raise UsageError(str(exc)) from None
    if not isinstance(spec, dict):
        raise UsageError("the spec must be a JSON object", hint='e.g. --spec \'{"steps": 6}\'')
    refuse_nul(spec, "spec")
    if not 0 < len(machine_id) <= MAX_MACHINE_ID:
        raise UsageError(f"machine id {machine_id[:80]!r} has {len(machine_id)} characters, "
                         f"not 1 to {MAX_MACHINE_ID}",
                         hint="pick a shorter --id, or leave it out for a UUID")
    try:
        normalised = decider.validate_spec(spec)
    except InvalidSpec as exc:
        raise UsageError(f"invalid {kind} spec: {exc}") from None
    state = decider.initial_state(machine_id, normalised)
    await event_store.create_machine(
        db, machine_id=machine_id, kind=kind, spec=normalised,
        initial=Projection(state.phase, state.to_json(), state.terminal, state.wake_keys),
        now=now, worker_id=requester,
    )
    return machine_id


def refuse_nul(value: object, field: str) -> None:
    """Refuse a NUL character anywhere in ``value`` (keys too), naming the field.

    PostgreSQL cannot store U+0000 in text or JSONB: letting one through made the insert
    fail as an internal error on PostgreSQL, while SQLite stored it — one input, two
    behaviours. It is never meaningful in a name, a UID, a node or a reference."""
    if isinstance(value, str):
        if "\x00" in value:
            raise UsageError(f"{field} contains a NUL character")
    elif isinstance(value, dict):
        for key, item in value.items():
            refuse_nul(key, f"{field} (a key)")
            refuse_nul(item, f"{field}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            refuse_nul(item, f"{field}[{i}]")


async def send_command(
    db: Database, kinds: KindRegistry, *, machine_id: str, command: Command, now: datetime,
    requester: str = OPERATOR,
) -> int:
    """Append the events ``accept`` returns for ``command``, recorded as ``requester``'s;
    return the new version."""
    refuse_nul(dict(command.data), "command")
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(ConcurrencyConflict), stop=stop_after_attempt(5),
        reraise=True,
    ):
        with attempt:
            return await _send_once(db, kinds, machine_id, command, now, requester)
    raise AssertionError("unreachable")  # pragma: no cover


async def _send_once(
    db: Database, kinds: KindRegistry, machine_id: str, command: Command, now: datetime,
    requester: str,
) -> int:
    record = await queries.get_machine(db, machine_id)
    decider = kinds.get(record.kind)
    state: Any = decider.load_state(record.state)
    try:
        events = tuple(decider.accept(state, command, now))
    except CommandRejected as exc:
        raise UsageError(f"{command.type} refused for {machine_id}: {exc}") from None
    if not events:
        return record.version
    new_state = fold(decider, state, events)
    return await event_store.commit(
        db, machine_id=machine_id, expected_version=record.version, events=events,
        projection=Projection(new_state.phase, new_state.to_json(), new_state.terminal,
                              new_state.wake_keys),
        cause="command", decision_input={"command": {"type": command.type, "data": command.data}},
        now=now, worker_id=requester,
    )


async def wake(db: Database, kinds: KindRegistry, *, machine_id: str, now: datetime,
               requester: str = OPERATOR) -> int:
    """Make a live machine due now, and record who asked (``WakeRequested``, cause
    ``wake``: nothing to re-decide, the state is unchanged); return how many woke."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(ConcurrencyConflict), stop=stop_after_attempt(5),
        reraise=True,
    ):
        with attempt:
            record = await queries.get_machine(db, machine_id)
            if record.terminal:
                return 0
            state: Any = kinds.get(record.kind).load_state(record.state)
            await event_store.commit(
                db, machine_id=machine_id, expected_version=record.version,
                events=(WakeRequested(at=now).recorded(),),
                projection=Projection(record.phase, record.state, record.terminal,
                                      state.wake_keys),
                cause="wake", decision_input={}, now=now, worker_id=requester)
    return await leases.wake_machine(db, machine_id=machine_id, now=now)


@dataclass(frozen=True)
class Submission:
    """The outcome of :func:`submit_operation`: the machine, and why it waits, if it does."""

    machine_id: str
    queued: str | None = None


def _workload_of(kind: str, spec: JsonObject, observation: Observation) -> tuple[str, str | None]:
    """The workload (``namespace/name``) an operation acts on, and its source node."""
    if kind == "drain":  # one live drain per node; "node:" cannot be a namespace name
        return f"node:{spec['node']}", None
    pod = spec.get("pod")
    if isinstance(pod, dict):  # checkpoint, migration, suspend: an existing, observed pod
        key = pod_key(str(pod["namespace"]), str(pod["name"]))
        seen = observation.pods.get(key)
        return key, seen.node if isinstance(seen, PodView) else None
    return pod_key(str(spec["namespace"]), str(spec["name"])), None  # restore, resume


async def submit_operation(
    db: Database,
    kinds: KindRegistry,
    observer: Observer,
    *,
    kind: str,
    spec: JsonObject,
    machine_id: str,
    now: datetime,
    limits: Limits | None = None,
    requester: str = OPERATOR,
) -> Submission:
    """Submit a product operation: observe, validate, then admit, queue or refuse.

    Bad input (unknown pod, pod not running, target = current node, unknown or cordoned
    node, bad artifact ref...) and a workload that already has a live operation are
    refused with a :class:`UsageError` naming the field, and nothing is written. A
    cluster or per-node limit holds the machine in the admission queue instead.
    """
    refuse_nul(spec, "spec")
    try:
        interests = submission_interests(kind, spec)
        observation = await observer.observe(interests)
        normalised = validate_submission(kind, spec, observation)
    except SubmissionUnverifiable as exc:
        raise ControlPlaneError(f"cannot check the {kind} request now: {exc}",
                                hint="the cluster or registry did not answer; retry") from None
    except InvalidSpec as exc:  # SubmissionRejected included
        raise UsageError(f"invalid {kind} request: {exc}") from None
    workload, source_node = _workload_of(kind, normalised, observation)
    request = OperationRequest(kind, workload, source_node)
    decider = kinds.get(kind)
    state = decider.initial_state(machine_id, normalised)
    held: list[str] = []

    def admit(facts: AdmissionFacts) -> str | None:
        op = facts.same_workload
        same = None if op is None else ActiveOperation(op.machine_id, op.kind, op.workload,
                                                       op.source_node, queued=op.held)
        verdict = admission_from_counts(request, same, facts.running_by_kind,
                                        facts.on_node_by_kind, limits or Limits())
        if isinstance(verdict, Reject):
            # Today's only refusal is a live operation on the same workload.
            raise WorkloadBusy(f"{kind} of {workload} refused: {verdict.reason}")
        if isinstance(verdict, Queue):
            held.append(verdict.reason)
            return verdict.reason
        return None

    await event_store.create_machine(
        db, machine_id=machine_id, kind=kind, spec=normalised,
        initial=Projection(state.phase, state.to_json(), state.terminal, state.wake_keys),
        now=now, worker_id=requester, workload=workload, source_node=source_node,
        admission=admit,
    )
    return Submission(machine_id, held[0] if held else None)


#: Terminal phases after which a restored pod runs (its name is the operation's answer).
RESTORED_PHASES = frozenset({"Succeeded", "RolledBack", "Resumed", "GarbageCollectionFailed"})


def final_pod(record: MachineRecord) -> str | None:
    """``namespace/name`` of the pod a migration, resume or restore left running (the
    last restore attempt's pod), or ``None`` before it is verified or when none runs."""
    if record.phase not in RESTORED_PHASES or not isinstance(record.state, dict):
        return None
    restore = record.state.get("restore")
    plan = restore.get("plan") if isinstance(restore, dict) else None
    if not isinstance(plan, dict) or not plan.get("pod_name"):
        return None
    return f"{plan.get('namespace')}/{plan['pod_name']}"
