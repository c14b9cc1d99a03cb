"""The drain's typed events are recorded with the keys, in the order, its histories have
always held (``at`` first), and read back as the same values."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from controlplane.machines.base.events import Started
from controlplane.machines.drain.events import (
    DRAIN_EVENTS,
    ChildFinished,
    ChildOutcome,
    ChildrenSkipped,
    ChildStarted,
    CordonRequested,
    DrainCancelRequested,
    DrainFinished,
    LateChild,
    LateLeft,
    NodeCordoned,
    NodeRechecked,
    NodeRecheckRequested,
    NodeUncordoned,
    PlanExtended,
    UncordonRequested,
)

AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
T = '"at": "2026-03-01T12:00:00+00:00"'


def test_each_drain_event_is_recorded_as_histories_hold_it() -> None:
    outcome = ChildOutcome(child="c1", pod="apps/p1", target="nb", status="Finished",
                           phase="Succeeded", reason="")
    cases = [
        (Started(at=AT, kind="drain", node="na"), "Started",
         f'{{{T}, "kind": "drain", "node": "na"}}'),
        (CordonRequested(at=AT, node="na"), "CordonRequested", f'{{{T}, "node": "na"}}'),
        (NodeCordoned(at=AT, node="na", already=False), "NodeCordoned",
         f'{{{T}, "node": "na", "already": false}}'),
        (ChildStarted(at=AT, child="c1", pod="apps/p1", uid="u1", target="nb", in_flight=1),
         "ChildStarted",
         f'{{{T}, "child": "c1", "pod": "apps/p1", "uid": "u1", "target": "nb", '
         '"in_flight": 1}'),
        (ChildFinished(at=AT, child="c1", pod="apps/p1", target="nb", phase="Succeeded",
                       reason="", succeeded=True), "ChildFinished",
         f'{{{T}, "child": "c1", "pod": "apps/p1", "target": "nb", "phase": "Succeeded", '
         '"reason": "", "succeeded": true}'),
        (ChildrenSkipped(at=AT, children=("c2", "c3"), reason="cancelled"), "ChildrenSkipped",
         f'{{{T}, "children": ["c2", "c3"], "reason": "cancelled"}}'),
        (DrainCancelRequested(at=AT, in_flight=1, pending=2), "CancelRequested",
         f'{{{T}, "in_flight": 1, "pending": 2}}'),
        (UncordonRequested(at=AT, node="na"), "UncordonRequested", f'{{{T}, "node": "na"}}'),
        (NodeUncordoned(at=AT, node="na"), "NodeUncordoned", f'{{{T}, "node": "na"}}'),
        (DrainFinished(at=AT, phase="Succeeded", reason="Drained", message="moved 1",
                       children=1, succeeded=1, failed=0, skipped=0, in_flight=0,
                       children_outcomes=(outcome,)), "DrainFinished",
         f'{{{T}, "phase": "Succeeded", "reason": "Drained", "message": "moved 1", '
         '"children": 1, "succeeded": 1, "failed": 0, "skipped": 0, "in_flight": 0, '
         '"children_outcomes": [{"child": "c1", "pod": "apps/p1", "target": "nb", '
         '"status": "Finished", "phase": "Succeeded", "reason": ""}]}'),
        (NodeRecheckRequested(at=AT, node="na", check=1), "NodeRecheckRequested",
         f'{{{T}, "node": "na", "check": 1}}'),
        (PlanExtended(at=AT, node="na", check=1, children=(LateChild(
            child="c9", namespace="apps", name="late", uid="u9", target="nb", successor="",
            template={"spec": {}}),), left=(LateLeft(pod="apps/ds", reason="DaemonSet"),)),
         "PlanExtended",
         f'{{{T}, "node": "na", "check": 1, "children": [{{"child": "c9", '
         '"namespace": "apps", "name": "late", "uid": "u9", "target": "nb", "successor": "", '
         '"template": {"spec": {}}}], "left": [{"pod": "apps/ds", "reason": "DaemonSet"}]}'),
        (NodeRechecked(at=AT, node="na", check=1, joined=1, starting=("apps/new",)),
         "NodeRechecked",
         f'{{{T}, "node": "na", "check": 1, "joined": 1, "starting": ["apps/new"]}}'),
    ]
    for event, wire_name, data in cases:
        recorded = event.recorded({"node": "na"})
        assert (recorded.type, json.dumps(recorded.data)) == (wire_name, data)
        assert DRAIN_EVENTS.decode(recorded) == event
    assert {wire_name for _, wire_name, _ in cases} | {
        "Queued", "Admitted", "ActionFailed", "WakeRequested"} == DRAIN_EVENTS.names
