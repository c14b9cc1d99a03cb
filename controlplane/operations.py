"""Submitting machines and sending them commands: the write path for operators.

Validation is the decider's (``validate_spec``, ``accept``), so a bad spec or a refused
command is a one-line :class:`UsageError` naming the field, and nothing is written. A
command is appended with the same optimistic check as a worker's decision and wakes the
machine; if a worker commits first, the command is re-evaluated on the fresh state.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from controlplane.engine.decider import Command, CommandRejected, InvalidSpec, fold
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.kinds import KindRegistry, UnknownKind
from controlplane.errors import UsageError
from controlplane.store import event_store, queries
from controlplane.store.database import Database
from controlplane.store.errors import ConcurrencyConflict
from controlplane.store.records import Projection

OPERATOR = "operator"


async def submit(
    db: Database,
    kinds: KindRegistry,
    *,
    kind: str,
    spec: JsonObject,
    machine_id: str,
    now: datetime,
) -> str:
    """Validate ``spec`` and create the machine, due at once; return its id."""
    try:
        decider = kinds.get(kind)
    except UnknownKind as exc:
        raise UsageError(str(exc)) from None
    if not isinstance(spec, dict):
        raise UsageError("the spec must be a JSON object", hint='e.g. --spec \'{"steps": 6}\'')
    try:
        normalised = decider.validate_spec(spec)
    except InvalidSpec as exc:
        raise UsageError(f"invalid {kind} spec: {exc}") from None
    state = decider.initial_state(machine_id, normalised)
    await event_store.create_machine(
        db, machine_id=machine_id, kind=kind, spec=normalised,
        initial=Projection(state.phase, state.to_json(), state.terminal, state.wake_keys),
        now=now, worker_id=OPERATOR,
    )
    return machine_id


async def send_command(
    db: Database, kinds: KindRegistry, *, machine_id: str, command: Command, now: datetime
) -> int:
    """Append the events ``accept`` returns for ``command``; return the new version."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(ConcurrencyConflict), stop=stop_after_attempt(5),
        reraise=True,
    ):
        with attempt:
            return await _send_once(db, kinds, machine_id, command, now)
    raise AssertionError("unreachable")  # pragma: no cover


async def _send_once(
    db: Database, kinds: KindRegistry, machine_id: str, command: Command, now: datetime
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
        now=now, worker_id=OPERATOR,
    )
