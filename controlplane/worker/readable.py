"""A claimed machine this worker can read, or one it leaves to a newer worker.

During a rolling upgrade workers of two releases share the machines. A newer release may
write what an older one does not know: a machine kind, a field or an enum value in a
state (the projection every claim loads), an action type in the outbox. The older worker
must neither guess (decode the state with the unknown key dropped, record an unknown
action as failed) nor crash-loop (raise, back off, claim it again, forever). So
:func:`read_claimed` reads the whole claim before anything is decided, and raises
:class:`Unreadable` with the reason; the worker then gives the machine back untouched
and due (``store.leases.leave``: its outbox kept), and :class:`LeftMachines` keeps it out
of this worker's claims from then on, logs it once and counts it
(``controlplane_worker_machines_left_total`` by reason, and the gauge
``controlplane_worker_machines_left``). A worker that can read it claims it at once.

A state that no release can read (a corrupt row) takes the same way: it is left, logged
and counted, not decided on; the gauge staying above zero after a rollout says so.

Called by :class:`controlplane.worker.loop.Worker` on every claim.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from controlplane.engine.decider import Decider
from controlplane.engine.kinds import KindRegistry, UnknownKind
from controlplane.logs import get_logger
from controlplane.store.records import MachineRecord

log = get_logger("controlplane.worker")

UNKNOWN_KIND = "unknown_kind"
UNKNOWN_STATE = "unreadable_state"
UNKNOWN_ACTION = "unknown_action"


class Unreadable(Exception):
    """A claimed machine this worker cannot read; ``reason`` is one of the constants."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def read_claimed(record: MachineRecord, kinds: KindRegistry,
                 knows_action: Callable[[str], bool]) -> tuple[Decider[Any], Any]:
    """The machine's decider and state, or :class:`Unreadable`. Pure.

    The state codec refuses a key its dataclass does not declare and an enum value it
    does not have (``engine.codec``), so a field added by a newer release is an error
    here, not a silent loss.
    """
    try:
        decider = kinds.get(record.kind)
    except UnknownKind as exc:
        raise Unreadable(UNKNOWN_KIND, str(exc)) from None
    try:
        state = decider.load_state(record.state)
    except (ValueError, TypeError, KeyError) as exc:
        raise Unreadable(UNKNOWN_STATE, f"its state does not decode: {exc}") from None
    unknown = sorted({str(a.get("type")) for a in record.pending_actions
                      if not knows_action(str(a.get("type")))})
    if unknown:
        raise Unreadable(UNKNOWN_ACTION, f"its outbox holds actions of unknown type {unknown}")
    return decider, state


@dataclass
class LeftMachines:
    """The machines this worker left to a newer one: never claimed by it again."""

    ids: set[str] = field(default_factory=set)
    by_reason: Counter[str] = field(default_factory=Counter)

    def leave(self, record: MachineRecord, why: Unreadable, *, worker_id: str) -> None:
        """Remember ``record``'s machine; log and count it the first time only."""
        if record.id in self.ids:
            return
        self.ids.add(record.id)
        self.by_reason[why.reason] += 1
        log.warning("machine left to a newer worker", machine_id=record.id,
                    kind=record.kind, phase=record.phase, version=record.version,
                    reason=why.reason, detail=why.detail, worker_id=worker_id)

    @property
    def excluded(self) -> Collection[str]:
        return self.ids
