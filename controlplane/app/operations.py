"""Submitting machines and sending them commands: the write path for operators.

:func:`submit` creates a machine of any kind from its spec (``cpctl submit``);
:func:`submit_operation` a product operation from a spec built elsewhere (a drain's
child), through the checks and admission of :mod:`controlplane.app.requests`, which
the doors use from their fields. Validation is the decider's (``validate_spec``,
``accept``), so a bad spec or a refused command is a one-line :class:`UsageError` naming
the field, and nothing is written. A command is appended with the same optimistic check
as a worker's decision and wakes the machine; if a worker commits first, the command is
re-evaluated on the fresh state.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from controlplane.app.requests import (
    OPERATOR,
    Submission,
    check_machine_id,
    prepare_spec,
    refuse_nul,
)
from controlplane.app.requests import submit as submit_prepared
from controlplane.engine.commands import Command, command_input
from controlplane.engine.decider import Cause, CommandRejected, InvalidSpec, fold
from controlplane.engine.events import WakeRequested
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.kinds import KindRegistry, UnknownKind
from controlplane.errors import UsageError
from controlplane.machines.submission import Limits
from controlplane.store import event_store, leases, queries
from controlplane.store.database import Database
from controlplane.store.errors import ConcurrencyConflict
from controlplane.store.records import Projection
from controlplane.worker.ports import Observer

__all__ = ["OPERATOR", "Submission", "refuse_nul"]


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
    check_machine_id(machine_id)
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
        cause=Cause.COMMAND, decision_input=command_input(command),
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
                cause=Cause.WAKE, decision_input={}, now=now, worker_id=requester)
    return await leases.wake_machine(db, machine_id=machine_id, now=now)


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
    """Submit a product operation from its spec (a drain's child; tests): observe what it
    names, check it, then admit, queue or refuse it (:mod:`controlplane.app.requests`).

    Bad input (unknown pod, pod not running, target = current node, unknown or cordoned
    node, bad artifact ref...) and a workload that already has a live operation are
    refused with a :class:`UsageError` naming the field, and nothing is written. A
    cluster or per-node limit holds the machine in the admission queue instead.
    """
    prepared = await prepare_spec(observer, kind=kind, spec=spec)
    return await submit_prepared(db, kinds, prepared, machine_id=machine_id, now=now,
                                 limits=limits, requester=requester)
