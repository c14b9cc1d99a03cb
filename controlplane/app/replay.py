"""Replay: rebuild projections from events, and verify that decisions are deterministic.

- ``rebuild``: for every machine, ``initial_state(spec)`` folded with ``evolve`` over its
  events must equal the stored projection (state, phase, terminal flag, version). With
  ``write=True`` a differing projection is rewritten from the events (events win);
  ``jobs=N`` rebuilds N id ranges in N processes.
- ``verify``: re-run every recorded decision on exactly what it saw — ``decide`` on the
  recorded observation at the recorded time, ``accept`` on the recorded command — and
  report any decision whose events would now differ (a workflow replayer's determinism
  check: it catches a changed decider that would rewrite history).

Callers: ``cpctl replay`` and tests. ``rebuild`` reads through ``store.replay_reads``
(events only), ``verify`` through ``store.queries.stream_histories`` (with decisions).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from multiprocessing.queues import Queue
from queue import Empty
from typing import Any, Protocol

from controlplane.engine.commands import RecordedCommand
from controlplane.engine.decider import Cause, CommandRejected, Decider, Event, fold
from controlplane.engine.events import Submitted
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.engine.kinds import KindRegistry
from controlplane.engine.observation import Observation
from controlplane.gc_tuning import collector_paused
from controlplane.store import queries, replay_reads, replay_writes
from controlplane.store.database import Database, open_database
from controlplane.store.records import DecisionRecord, MachineRecord, Projection, RecordedEvent
from controlplane.store.replay_reads import StoredProjection


@dataclass(frozen=True)
class Mismatch:
    machine_id: str
    seq: int
    what: str
    expected: JsonValue
    actual: JsonValue


@dataclass
class ReplayReport:
    machines: int = 0
    events: int = 0
    #: Decisions re-made (``--verify``): those caused by an observation or a command.
    decisions: int = 0
    #: Decision records with nothing to re-make: the engine's own (a machine submitted,
    #: queued or admitted, an action given up on) and operators' wakes.
    not_redecided: int = 0
    rewritten: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.mismatches


def _norm(value: Any) -> JsonValue:
    normalised: JsonValue = json.loads(json.dumps(value, sort_keys=True))
    return normalised


def _as_event(e: RecordedEvent) -> Event:
    return Event(e.type, e.data, e.facts)


def _event_json(e: Event) -> JsonValue:
    return _norm({"type": e.type, "data": e.data, "facts": e.facts})


class _Machine(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...


class _Foldable(Protocol):
    @property
    def seq(self) -> int: ...
    @property
    def type(self) -> str: ...
    @property
    def data(self) -> JsonObject: ...


def _first_state(kinds: KindRegistry, record: _Machine,
                 events: Sequence[_Foldable]) -> tuple[Decider[Any], Any]:
    """The machine's decider and its state before any event after ``Submitted``."""
    decider = kinds.get(record.kind)
    if not events or events[0].seq != 1:
        raise ValueError(f"machine {record.id} has no Submitted event at seq 1")
    spec = events[0].data.get("spec", {})
    assert isinstance(spec, dict)
    return decider, decider.initial_state(record.id, spec)


def replay_machine(kinds: KindRegistry, record: _Machine,
                   events: Sequence[_Foldable]) -> tuple[Any, int]:
    """The state folded from a machine's events, and its version (last seq).

    The events are folded as they are: ``evolve`` reads only an event's type and data
    (``EventLike``), so a read row is not copied into an ``Event`` first.
    """
    decider, state = _first_state(kinds, record, events)
    evolve = decider.evolve
    for i in range(1, len(events)):
        state = evolve(state, events[i])
    return state, events[-1].seq


@dataclass(frozen=True)
class RebuildProgress:
    """How far a rebuild is: machines and events folded so far, of ``total`` machines."""

    machines: int
    events: int
    total: int


#: Called now and then during a rebuild (every ``PROGRESS_EVERY`` machines per process).
Progress = Callable[[RebuildProgress], None]
PROGRESS_EVERY = 1000
_Tick = Callable[[int, int], None]  # machines, events folded since the last tick


#: From this many machines, ``cpctl replay`` rebuilds in parallel unless told otherwise
#: (below it, starting the processes costs more than it saves).
AUTO_PARALLEL_MACHINES = 20_000
AUTO_MAX_JOBS = 8


def auto_jobs(machines: int, cpus: int) -> int:
    """Processes for a rebuild of ``machines`` on ``cpus`` cores: one per core (at most
    ``AUTO_MAX_JOBS``) for a large history, else one."""
    if machines < AUTO_PARALLEL_MACHINES:
        return 1
    return max(1, min(cpus, AUTO_MAX_JOBS))


async def rebuild(db: Database, kinds: KindRegistry, *, now: datetime,
                  write: bool = False, jobs: int = 1,
                  progress: Progress | None = None) -> ReplayReport:
    """Fold every machine's events and compare with (``write``: put back) its projection.

    ``jobs`` > 1 splits the machines into that many id ranges, each rebuilt by its own
    process on its own connection (the fold is CPU-bound Python: threads would share one
    core). The report is the same as one process's, mismatches in id order.
    ``progress`` is called with the running totals as the processes report them.
    """
    ranges = await replay_reads.split_ids(db, jobs) if jobs > 1 else [("", None)]
    tick = await _ticker(db, progress)
    if len(ranges) == 1:
        return await _rebuild_range(db, kinds, now=now, write=write, tick=tick)
    return _merged(await _in_processes(db, ranges, tick, _rebuild_part, kinds, now, write))


async def verify(db: Database, kinds: KindRegistry, *, jobs: int = 1,
                 progress: Progress | None = None) -> ReplayReport:
    """Re-run every recorded decision on what it saw (see the module docstring).

    ``jobs`` and ``progress`` as for :func:`rebuild`.
    """
    ranges = await replay_reads.split_ids(db, jobs) if jobs > 1 else [("", None)]
    tick = await _ticker(db, progress)
    if len(ranges) == 1:
        return await _verify_range(db, kinds, tick=tick)
    return _merged(await _in_processes(db, ranges, tick, _verify_part, kinds))


async def _ticker(db: Database, progress: Progress | None) -> _Tick:
    """A tick that adds up what the processes report and passes the totals on."""
    total = await replay_reads.count_machines(db) if progress is not None else 0
    done = [0, 0]

    def tick(machines: int, events: int) -> None:
        done[0] += machines
        done[1] += events
        if progress is not None:
            progress(RebuildProgress(done[0], done[1], total))

    return tick


async def _in_processes(db: Database, ranges: Sequence[tuple[str, str | None]], tick: _Tick,
                        part: Callable[..., ReplayReport], *args: Any) -> list[ReplayReport]:
    """``part(url, after, until, *args)`` for each id range, each in its own process."""
    url = db.url.render_as_string(hide_password=False)
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")  # no inherited event loop or pool
    ticks: Queue[tuple[int, int]] = spawn.Queue()
    with ProcessPoolExecutor(max_workers=len(ranges), mp_context=spawn,
                             initializer=_start_child, initargs=(ticks,)) as pool:
        running = [loop.run_in_executor(pool, part, url, after, until, *args)
                   for after, until in ranges]
        pending: set[asyncio.Future[ReplayReport]] = set(running)
        while pending:
            _done, pending = await asyncio.wait(pending, timeout=0.25)
            _drain(ticks, tick)
        parts = [future.result() for future in running]
    _drain(ticks, tick)
    return parts


def _merged(parts: list[ReplayReport]) -> ReplayReport:
    report = ReplayReport()
    for part in parts:  # in id order, so mismatches stay in id order
        report.machines += part.machines
        report.events += part.events
        report.decisions += part.decisions
        report.not_redecided += part.not_redecided
        report.rewritten += part.rewritten
        report.mismatches.extend(part.mismatches)
    return report


def _drain(ticks: Queue[tuple[int, int]], tick: _Tick) -> None:
    while True:
        try:
            machines, events = ticks.get_nowait()
        except Empty:
            return
        tick(machines, events)


_child_ticks: Queue[tuple[int, int]] | None = None


def _start_child(ticks: Queue[tuple[int, int]]) -> None:
    """A parallel run's child: its progress goes to the parent through ``ticks``."""
    global _child_ticks
    _child_ticks = ticks


def _child_tick(machines: int, events: int) -> None:
    if _child_ticks is not None:
        _child_ticks.put((machines, events))


def _in_child(url: str, work: Callable[[Database], Awaitable[ReplayReport]]) -> ReplayReport:
    """Run ``work`` on a connection of the child's own (runs in the child)."""
    async def run() -> ReplayReport:
        db = open_database(url, pool_size=2)
        try:
            return await work(db)
        finally:
            await db.dispose()

    return asyncio.run(run())


def _rebuild_part(url: str, after: str, until: str | None, kinds: KindRegistry,
                  now: datetime, write: bool) -> ReplayReport:
    """One process's share of a parallel rebuild."""
    return _in_child(url, lambda db: _rebuild_range(
        db, kinds, now=now, write=write, after=after, until=until, tick=_child_tick))


def _verify_part(url: str, after: str, until: str | None, kinds: KindRegistry) -> ReplayReport:
    """One process's share of a parallel verify."""
    return _in_child(url, lambda db: _verify_range(
        db, kinds, after=after, until=until, tick=_child_tick))


class _Share:
    """One range's progress, passed to ``tick`` every ``PROGRESS_EVERY`` machines and at
    the end (what was not passed on yet)."""

    def __init__(self, tick: _Tick) -> None:
        self.tick = tick
        self.machines = 0
        self.events = 0

    def folded(self, report: ReplayReport) -> None:
        if report.machines - self.machines >= PROGRESS_EVERY:
            self.flush(report)

    def flush(self, report: ReplayReport) -> None:
        if report.machines > self.machines:
            self.tick(report.machines - self.machines, report.events - self.events)
            self.machines, self.events = report.machines, report.events


async def _rebuild_range(db: Database, kinds: KindRegistry, *, now: datetime, write: bool,
                         tick: _Tick, after: str = "", until: str | None = None,
                         ) -> ReplayReport:
    report = ReplayReport()
    share = _Share(tick)
    with collector_paused():
        async for record, events in replay_reads.stream_events(db, after=after, until=until):
            report.machines += 1
            report.events += len(events)
            state, version = replay_machine(kinds, record, events)
            differences = _projection_differences(record, state, version)
            report.mismatches.extend(differences)
            if differences and write:
                await replay_writes.rewrite_projection(
                    db, machine_id=record.id, version=version, now=now,
                    projection=Projection(state.phase, state.to_json(), state.terminal,
                                          state.wake_keys),
                )
                report.rewritten += 1
            share.folded(report)
    share.flush(report)
    return report


def _projection_differences(record: StoredProjection, state: Any, version: int) -> list[Mismatch]:
    folded = state.to_json()
    if (folded == record.state and state.phase == record.phase
            and state.terminal == record.terminal and version == record.version):
        # Equal as Python values is equal after normalising (only a tuple-vs-list
        # difference could make them unequal here and equal there): skip the JSON round
        # trips, which were a third of a rebuild's time.
        return []
    pairs: list[tuple[str, JsonValue, JsonValue]] = [
        ("state", _norm(folded), _norm(record.state)),
        ("phase", state.phase, record.phase),
        ("terminal", state.terminal, record.terminal),
        ("version", version, record.version),
    ]
    return [Mismatch(record.id, version, what, want, got)
            for what, want, got in pairs if want != got]


async def _verify_range(db: Database, kinds: KindRegistry, *, tick: _Tick, after: str = "",
                        until: str | None = None) -> ReplayReport:
    report = ReplayReport()
    share = _Share(tick)
    with collector_paused():  # the same bulk, acyclic allocation as a rebuild
        async for record, events, decisions in queries.stream_histories(
                db, after=after, until=until):
            report.machines += 1
            report.events += len(events)
            remade = sum(1 for d in decisions if d.cause.redecided)
            report.decisions += remade
            report.not_redecided += len(decisions) - remade
            report.mismatches.extend(verify_machine(kinds, record, events, decisions))
            share.folded(report)
    share.flush(report)
    return report


def verify_machine(kinds: KindRegistry, record: MachineRecord, events: list[RecordedEvent],
                   decisions: list[DecisionRecord]) -> list[Mismatch]:
    decider = kinds.get(record.kind)
    by_seq = {e.seq: e for e in events}
    spec = events[0].data.get("spec", {}) if events else {}
    assert isinstance(spec, dict)
    state: Any = decider.initial_state(record.id, spec)
    mismatches: list[Mismatch] = []
    bounds = [d.first_seq for d in decisions] + [len(events) + 1]
    for decision, end in zip(decisions, bounds[1:], strict=True):
        recorded = [_as_event(by_seq[s]) for s in range(decision.first_seq, end) if s in by_seq]
        if decision.cause.redecided:
            produced = _redecide(decider, state, decision)
            want = [_event_json(e) for e in recorded]
            got = [_event_json(e) for e in produced]
            if want != got:
                mismatches.append(Mismatch(record.id, decision.first_seq,
                                           f"{decision.cause.value} decision", want, got))
        state = fold(decider, state, [e for e in recorded if e.type != Submitted.NAME])
    return mismatches


def _redecide(decider: Any, state: Any, decision: DecisionRecord) -> list[Event]:
    data: JsonObject = decision.input
    if decision.cause is Cause.OBSERVATION:
        obs = data.get("observation")
        if not isinstance(obs, dict):
            raise UnreadableDecision(decision, "no observation object")
        return list(decider.decide(state, Observation.from_json(obs), decision.decided_at).events)
    cmd = data.get("command")
    if not isinstance(cmd, dict):
        raise UnreadableDecision(decision, "no command object")
    cmd_type, cmd_data = cmd.get("type"), cmd.get("data", {})
    if not isinstance(cmd_type, str) or not isinstance(cmd_data, dict):
        raise UnreadableDecision(decision, "a command needs a type (text) and data (object)")
    try:
        return list(decider.accept(state, RecordedCommand(cmd_type, cmd_data),
                                   decision.decided_at))
    except CommandRejected as exc:
        return [Event("CommandRejected", {"reason": str(exc)})]


class UnreadableDecision(ValueError):
    """A recorded decision input that cannot be re-made: the record is damaged, or was
    written by a build whose inputs this one does not read."""

    def __init__(self, decision: DecisionRecord, problem: str) -> None:
        super().__init__(f"decision {decision.machine_id}@{decision.first_seq} "
                         f"({decision.cause.value}) cannot be re-made: {problem}")


def phase_after_each(kinds: KindRegistry, record: MachineRecord,
                     events: list[RecordedEvent]) -> list[str]:
    """The machine's phase after each of its events (``Submitted``: the initial phase).

    What ``cpctl history`` shows as the phase change: derived by ``evolve``, so it is
    exactly the phase a rebuild would give, and old histories get it too.
    """
    decider, state = _first_state(kinds, record, events)
    phases = [state.phase]
    for event in events[1:]:
        state = decider.evolve(state, _as_event(event))
        phases.append(state.phase)
    return phases
