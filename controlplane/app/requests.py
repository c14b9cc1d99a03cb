"""Asking for an operation, the one way every door does: prepare the kind's request on one
look at the cluster, then submit it or plan it.

A door (``cli``, ``api``, ``frontdoor``) turns its syntax into
:class:`~controlplane.machines.base.requests.Fields` and calls :func:`prepare`:

1. the kind's request is built from the fields (a bad or unknown field is refused,
   named as the door spells it);
2. what it names in the store is found (a checkpoint by id, the newest suspension of a
   workload: ``app.checkpoints``);
3. the pods it names are read, one GET each (the manifest its spec is built from and
   the view the checks read are the same answer), or the cluster is listed (a drain);
4. the spec is built, normalised by the kind's ``validate_spec``, and checked against
   that observation plus the nodes it names (``RequestKind.check``).

:func:`submit` then admits, queues or refuses it and creates the machine;
:func:`controlplane.app.plan.plan` shows what the machine would do first, writing
nothing. A refusal is a :class:`RequestRefused` (a ``UsageError`` naming the field); a
cluster that did not answer, a ``ControlPlaneError`` saying to retry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from controlplane.app.checkpoints import checkpoint_of, latest_suspension
from controlplane.app.ports import ClusterAccess
from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.kinds import KindRegistry
from controlplane.engine.observation import Interests, Observation, PodFact, ProbeError
from controlplane.errors import ControlPlaneError, UsageError
from controlplane.machines.base.requests import (
    Fields,
    Found,
    Request,
    Seen,
    SubmissionRejected,
    SubmissionUnverifiable,
)
from controlplane.machines.catalog import requested
from controlplane.machines.submission import (
    ActiveOperation,
    Limits,
    OperationRequest,
    Queue,
    Reject,
    admission_from_counts,
)
from controlplane.store import event_store
from controlplane.store.admission import AdmissionFacts
from controlplane.store.database import Database
from controlplane.store.errors import WorkloadBusy
from controlplane.store.records import Projection
from controlplane.worker.ports import Observer

OPERATOR = "operator"
#: The longest machine id (the ``machines.id`` column's size).
MAX_MACHINE_ID = 64


class RequestRefused(UsageError):
    """The request is wrong; ``field`` names the field as the door spells it."""

    def __init__(self, message: str, *, field: str | None = None, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.field = field


@dataclass(frozen=True)
class Prepared:
    """A request ready to submit or plan: its normalised spec, the observation it was
    checked on, the workload it acts on and its source node, and what a dry run shows
    beyond the generic plan."""

    kind: str
    spec: JsonObject
    observation: Observation
    workload: str
    source_node: str | None
    shown: JsonObject = field(default_factory=dict)


@dataclass(frozen=True)
class Submission:
    """The outcome of :func:`submit`: the machine, and why it waits, if it does."""

    machine_id: str
    queued: str | None = None


@contextlib.contextmanager
def _refusals(kind: str) -> Iterator[None]:
    """A rejection as the door's refusal, an unverifiable check as "retry"."""
    try:
        yield
    except SubmissionUnverifiable as exc:
        raise unverifiable(exc, kind) from None
    except SubmissionRejected as exc:
        raise refused(exc, kind) from None
    except InvalidSpec as exc:  # a value the request let through and the spec refuses
        raise refused(SubmissionRejected(str(exc)), kind) from None


def refused(exc: SubmissionRejected, kind: str) -> RequestRefused:
    return RequestRefused(f"invalid {kind} request: {exc}", field=exc.field,
                          hint=exc.hint or "")


def unverifiable(exc: Exception, kind: str) -> ControlPlaneError:
    return ControlPlaneError(f"cannot check the {kind} request now: {exc}",
                             hint="the cluster or registry did not answer; retry")


@dataclass(frozen=True)
class Asked:
    """A request parsed from a door's fields (nothing read yet)."""

    kind: str
    request: Request


def parse(kind: str, fields: Mapping[str, object],
          spelled: Mapping[str, str] | None = None) -> Asked:
    """The typed request of ``kind`` from a door's ``fields``, before anything is read: a
    bad or unknown field is refused here, naming it as the door spells it."""
    _, requests = requested(kind)
    refuse_nul(dict(fields), "request")
    try:
        return Asked(kind, requests.of(Fields(fields, spelled)))
    except SubmissionRejected as exc:
        raise refused(exc, kind) from None


async def prepare(db: Database, access: ClusterAccess, *, kind: str,
                  fields: Mapping[str, object], spelled: Mapping[str, str] | None = None
                  ) -> Prepared:
    """The request of ``kind`` from a door's ``fields``, checked on one look at the
    cluster (see the module docstring). ``spelled``: how the door spells each field."""
    return await prepare_asked(db, access, parse(kind, fields, spelled))


async def find(db: Database, asked: Asked) -> Found:
    """What the request names in the store (a ``UsageError`` when it is not there): read
    before the cluster is, so a request for nothing is refused without a connection."""
    lookups = asked.request.lookups()
    if lookups.checkpoint is not None:
        return Found(checkpoint=await checkpoint_of(db, lookups.checkpoint))
    if lookups.suspension_of is not None:
        return Found(checkpoint=await latest_suspension(db, *lookups.suspension_of))
    return Found()


async def prepare_asked(db: Database, access: ClusterAccess, asked: Asked,
                        found: Found | None = None) -> Prepared:
    """A parsed request, checked on one look at the cluster (see the module docstring);
    ``found``: its store lookups when the caller made them first (:func:`find`)."""
    kind, request = asked.kind, asked.request
    found_kind, requests = requested(kind)
    if found is None:
        found = await find(db, asked)
    with _refusals(kind):
        reads = request.reads(found)
        keys = sorted(reads.pods)
        answers = await asyncio.gather(*(access.read_pod(*key.split("/", 1)) for key in keys))
        pods: dict[str, PodFact] = {k: fact for k, (_, fact) in zip(keys, answers,
                                                                     strict=True)}
        for key, fact in pods.items():
            if isinstance(fact, ProbeError):
                raise SubmissionUnverifiable(f"could not read pod {key} ({fact.error_class}: "
                                             f"{fact.message}); retry")
        nodes, all_pods = ((await access.list_nodes(), await access.list_pods())
                           if reads.cluster else ([], []))
        built = request.build(Seen(found, {k: m for k, (m, _) in zip(keys, answers,
                                                                      strict=True)},
                                   nodes, all_pods))
        normal = _normalised(found_kind.decider.validate_spec, built.spec)
        observation = await _observe(access.observer, requests.interests(normal), pods)
        requests.check(normal, observation)
    workload, source = requests.workload(normal, observation)
    return Prepared(kind, normal, observation, workload, source, built.shown)


async def prepare_spec(observer: Observer, *, kind: str, spec: JsonObject) -> Prepared:
    """A spec built elsewhere (a drain's child, a test), through the same checks on one
    observation of what it names."""
    refuse_nul(spec, "spec")
    found_kind, requests = requested(kind)
    with _refusals(kind):
        normal = _normalised(found_kind.decider.validate_spec, spec)
        observation = await observer.observe(requests.interests(normal))
        requests.check(normal, observation)
    workload, source = requests.workload(normal, observation)
    return Prepared(kind, normal, observation, workload, source)


def _normalised(validate: Callable[[JsonObject], JsonObject], spec: JsonObject
                ) -> JsonObject:
    try:
        normal: JsonObject = validate(spec)
    except SubmissionRejected:
        raise
    except InvalidSpec as exc:
        raise SubmissionRejected(str(exc)) from None
    return normal


async def _observe(observer: Observer, interests: Interests,
                   pods: Mapping[str, PodFact]) -> Observation:
    """What ``interests`` name, the pods already read taken as read (not read twice)."""
    rest = Interests(pods=frozenset(k for k in interests.pods if k not in pods),
                     nodes=interests.nodes, tags=interests.tags,
                     machines=interests.machines)
    seen = await observer.observe(rest) if (rest.pods or rest.nodes or rest.tags
                                            or rest.machines) else Observation()
    return Observation(pods={**seen.pods, **{k: v for k, v in pods.items()
                                             if k in interests.pods}},
                       tags=seen.tags, nodes=seen.nodes, machines=seen.machines)


async def submit(db: Database, kinds: KindRegistry, prepared: Prepared, *, machine_id: str,
                 now: datetime, limits: Limits | None = None,
                 requester: str = OPERATOR) -> Submission:
    """Admit, queue or refuse a prepared request, and create its machine.

    A workload that already has a live operation is refused (``WorkloadBusy``) and
    nothing is written; a cluster or per-node limit holds the machine in the admission
    queue instead."""
    check_machine_id(machine_id)
    kind, workload, source_node = prepared.kind, prepared.workload, prepared.source_node
    request = OperationRequest(kind, workload, source_node)
    decider = kinds.get(kind)
    state = decider.initial_state(machine_id, prepared.spec)
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
        db, machine_id=machine_id, kind=kind, spec=prepared.spec,
        initial=Projection(state.phase, state.to_json(), state.terminal, state.wake_keys),
        now=now, worker_id=requester, workload=workload, source_node=source_node,
        admission=admit,
    )
    return Submission(machine_id, held[0] if held else None)


def check_machine_id(machine_id: str) -> None:
    if not 0 < len(machine_id) <= MAX_MACHINE_ID:
        raise UsageError(f"operation id {machine_id[:80]!r} has {len(machine_id)} characters, "
                         f"not 1 to {MAX_MACHINE_ID}",
                         hint="pick a shorter --id, or leave it out for a UUID")


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

