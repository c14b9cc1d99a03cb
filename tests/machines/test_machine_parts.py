"""The small parts the machines share: protocol, actions, codec, timing, names, catalog."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.engine.decider import Event
from controlplane.engine.kinds import KindRegistry
from controlplane.engine.observation import Interests
from controlplane.machines.base.codec import OMIT_DEFAULT, RawJson, decode, encode, encode_object
from controlplane.machines.base.events import ENGINE_EVENTS, EventSet, Started, UnknownEvent
from controlplane.machines.base.timing import backoff, next_poll
from controlplane.machines.catalog import product_kinds
from controlplane.machines.contract import protocol
from controlplane.machines.contract.actions import (
    ActionType,
    EventType,
    annotate_pod,
    create_pod,
    delete_manifest,
    delete_pod,
    emit_event,
    remove_pod_annotations,
)
from controlplane.machines.stages.restore import restore_pod_name
from tests.machines.machines_gwt import T0, at, digest_of, manifest, pod


def test_capture_request_carries_the_protocol_version_and_is_withdrawable() -> None:
    """The request names checkpoint, artifact, source UID, containers, quiesce, version."""
    ann = protocol.capture_request(checkpoint_id="c1", artifact="r.io/a:t", source_uid="u",
                                   containers=("a", "b"), quiesce=True, saver="{}")
    assert ann[protocol.CAPTURE_CONTAINERS] == "a,b"
    assert ann[protocol.CAPTURE_QUIESCE] == "true"
    assert ann[protocol.PROTOCOL] == protocol.PROTOCOL_VERSION == "v1"
    assert set(ann) == set(protocol.CAPTURE_REQUEST_KEYS)
    assert all(k.startswith(protocol.PREFIX) for k in ann)


def test_agent_reports_for_another_checkpoint_are_ignored() -> None:
    """A report is bound to its checkpoint id; a leftover report means nothing."""
    p = pod(annotations={protocol.REPORT_CHECKPOINT_ID: "old", protocol.REPORT_STATE: "Pushed"})
    assert protocol.capture_report(p, "new") is None
    assert protocol.capture_report(p, "old") == protocol.CaptureReport(
        protocol.ReportState.PUSHED, "", "")


def test_unknown_report_state_is_ignored() -> None:
    """A report state the protocol does not know is not trusted."""
    p = pod(annotations={protocol.REPORT_CHECKPOINT_ID: "c", protocol.REPORT_STATE: "Done"})
    assert protocol.capture_report(p, "c") is None


def test_provenance_needs_a_digest_the_checkpoint_and_the_source_uid() -> None:
    """Gate 1 spelled out: each missing binding is a named problem."""
    d = digest_of("x")
    assert protocol.provenance_problem(manifest("r", d, checkpoint_id="c", uid="u"),
                                       checkpoint_id="c", source_uid="u") is None
    assert "checkpoint" in str(protocol.provenance_problem(
        manifest("r", d, checkpoint_id="b", uid="u"), checkpoint_id="c", source_uid="u"))
    assert "uid" in str(protocol.provenance_problem(
        manifest("r", d, checkpoint_id="c", uid="v"), checkpoint_id="c", source_uid="u"))
    assert "digest" in str(protocol.provenance_problem(
        manifest("r", "md5:1", checkpoint_id="c", uid="u"), checkpoint_id="c",
        source_uid="u"))


def test_cold_boot_pods_carry_no_restore_artifact() -> None:
    """Only a restore names an artifact; a cold boot is marked by its key alone."""
    cold = protocol.restore_request(artifact=None, restore_key="m/1", checkpoint_id=None,
                                    loader="{}")
    assert protocol.RESTORE_ARTIFACT not in cold
    assert protocol.RESTORE_LOADER not in cold
    warm = protocol.restore_request(artifact="r.io/a@" + digest_of("x"), restore_key="m/1",
                                    checkpoint_id="c", loader="{}")
    assert warm[protocol.RESTORE_CHECKPOINT_ID] == "c"


def test_action_constructors_fill_the_documented_params() -> None:
    """Each action type carries its preconditions (UIDs) and deterministic key."""
    a = annotate_pod("k1", namespace="n", name="p", uid="u", annotations={"b": "2", "a": "1"})
    assert a.params == {"namespace": "n", "name": "p", "uid": "u",
                        "annotations": {"a": "1", "b": "2"}}
    assert remove_pod_annotations("k", namespace="n", name="p", uid="u",
                                  keys=("x",)).params["keys"] == ["x"]
    assert delete_pod("k", namespace="n", name="p", uid="u", reason="r").params["uid"] == "u"
    c = create_pod("k", namespace="n", name="p", template={"spec": {}}, node="node-b",
                   annotations={}, labels={"l": "v"})
    assert c.params["node"] == "node-b"
    assert "nodeName" not in str(c.params)
    assert delete_manifest("k", repository="r.io/a", digest="sha256:x").params == {
        "repository": "r.io/a", "digest": "sha256:x"}
    e = emit_event("k", namespace="n", pod_name="p", pod_uid=None, type_=EventType.WARNING,
                   reason="R", message="m")
    assert e.params["type"] == "Warning"
    assert {a.type, c.type, e.type} <= set(ActionType)


@dataclass(frozen=True)
class Sample:
    when: datetime
    maybe: datetime | None
    names: tuple[str, ...]
    blob: RawJson
    kind: EventType = EventType.NORMAL


def test_codec_round_trips_datetimes_enums_tuples_and_raw_json() -> None:
    """decode(encode(x)) == x; datetimes travel as ISO text."""
    s = Sample(T0, None, ("a", "b"), {"k": [1, {"x": None}]}, EventType.WARNING)
    data = encode(s)
    assert isinstance(data, dict)
    assert data["when"] == T0.isoformat()
    assert decode(Sample, data) == s


def test_codec_refuses_naive_datetimes() -> None:
    """States hold timezone-aware times only."""
    with pytest.raises(ValueError, match="naive"):
        encode(Sample(datetime(2026, 1, 1), None, (), {}))


def test_codec_refuses_naive_datetimes_nested_in_collections() -> None:
    """The refusal reaches a datetime wherever it sits, not only in a field."""
    with pytest.raises(ValueError, match="naive"):
        encode({"at": [T0, datetime(2026, 1, 1)]})


def test_codec_refuses_values_json_cannot_hold_and_names_their_type() -> None:
    """A set (no JSON order) is a programming error, named, not silently dropped."""
    with pytest.raises(TypeError, match="frozenset"):
        encode(Sample(T0, None, (), {"k": frozenset({1})}))


def test_codec_writes_enums_by_value_and_non_string_keys_as_strings() -> None:
    """What a projection column holds: plain JSON, whatever Python types built it."""
    assert encode({1: EventType.WARNING, "t": (T0,)}) == {
        "1": EventType.WARNING.value, "t": [T0.isoformat()]}


def test_codec_refuses_mistyped_values() -> None:
    """A wrong JSON shape is an error, not a silently wrong state."""
    with pytest.raises(ValueError, match=r"no union member|expected"):
        decode(Sample, {"when": 5, "maybe": None, "names": [], "blob": {}})


def test_next_poll_backs_off_to_thirty_seconds() -> None:
    """Registry probes: 2 s, then doubling, capped at 30 s."""
    assert next_poll(T0, T0) == at(2)
    assert next_poll(T0, at(2)) == at(6)
    assert next_poll(T0, at(6)) == at(14)
    assert next_poll(T0, at(1000)) - next_poll(T0, at(970)) == timedelta(seconds=30)


@given(attempt=st.integers(1, 100))
@settings(max_examples=30)
def test_backoff_is_capped(attempt: int) -> None:
    """Backoff never exceeds its cap."""
    assert backoff(attempt, base=timedelta(seconds=10),
                   cap=timedelta(minutes=10)) <= timedelta(minutes=10)


def test_events_carry_their_decision_time() -> None:
    """evolve reads time from the event, never from a clock: an event's ``at`` is written
    as timezone-aware ISO text and read back as that moment."""
    events = EventSet(ENGINE_EVENTS, [Started])
    recorded = Started(at=T0, kind="checkpoint").recorded()
    assert recorded.data["at"] == T0.isoformat()
    opening = events.decode(recorded)
    assert isinstance(opening, Started)
    assert opening.at == T0
    assert opening.at.tzinfo is not None
    with pytest.raises(UnknownEvent, match="missing"):
        events.decode(Event("Started", {"kind": "checkpoint"}))
    with pytest.raises(UnknownEvent, match="timezone"):
        events.decode(Event("Started", {"at": "2026-01-01T00:00:00", "kind": "checkpoint"}))
    with pytest.raises(ValueError, match="naive"):
        Started(at=datetime(2026, 1, 1), kind="checkpoint").recorded()


@given(base=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,70}[a-z0-9])?", fullmatch=True),
       attempt=st.integers(1, 99))
@settings(max_examples=60)
def test_restored_pod_names_are_deterministic_dns_labels(base: str, attempt: int) -> None:
    """Same machine and attempt, same name; always a DNS label; suffixes do not pile up."""
    name = restore_pod_name(base, "mig-1", attempt)
    assert name == restore_pod_name(base, "mig-1", attempt)
    assert len(name) <= 63
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    assert restore_pod_name(name, "mig-2", 1).count("-r") == restore_pod_name(
        base, "mig-2", 1).count("-r")


def test_catalog_registers_every_product_kind_once() -> None:
    """product_kinds() feeds the engine's registry: six distinct kinds."""
    registry = KindRegistry(product_kinds())
    assert sorted(registry) == ["checkpoint", "drain", "migration", "restore", "resume",
                                "suspend"]


def test_initial_states_round_trip_and_ask_to_observe_something() -> None:
    """Every kind's initial state survives to_json/load_state and is not terminal."""
    specs = {
        "checkpoint": {"pod": {"namespace": "a", "name": "p", "uid": "u"}},
        "migration": {"pod": {"namespace": "a", "name": "p", "uid": "u"},
                      "source_node": "n1", "target_node": "n2",
                      "template": {"spec": {"containers": [{"name": "c"}]}}},
        "restore": {"artifact": "r.io/a@" + digest_of("x"), "namespace": "a", "name": "p",
                    "node": "n2", "template": {"spec": {"containers": [{"name": "c"}]}}},
        "suspend": {"pod": {"namespace": "a", "name": "p", "uid": "u"},
                    "template": {"spec": {"containers": [{"name": "c"}]}}},
        "resume": {"namespace": "a", "name": "p",
                   "template": {"spec": {"containers": [{"name": "c"}]}}},
        "drain": {"node": "n1", "max_parallel": 2, "class": {"repository": "r.io/a"},
                  "children": [{"pod": {"namespace": "a", "name": "p", "uid": "u"},
                                "target": "n2",
                                "template": {"spec": {"containers": [{"name": "c"}]}}}],
                  "left": []},
    }
    for decider in product_kinds():
        spec = decider.validate_spec(specs[decider.kind])  # type: ignore[arg-type]
        assert decider.validate_spec(spec) == spec, "validate_spec is idempotent"
        state = decider.initial_state("m-1", spec)
        assert decider.load_state(state.to_json()) == state
        assert not state.terminal
        assert isinstance(decider.interests(state), Interests)



@dataclass(frozen=True)
class _Item:
    name: str
    extra: str = field(default="", metadata=OMIT_DEFAULT)


@dataclass(frozen=True)
class _Holder:
    items: tuple[_Item, ...]


def test_a_marked_field_of_dataclasses_in_a_tuple_is_left_out_while_default() -> None:
    """A drain's children (a tuple) gained ``successor``: rows written before it fold to
    the very projection they wrote, and the key appears only when set."""
    held = _Holder((_Item("a"), _Item("b", extra="x")))
    encoded = encode_object(held)
    assert encoded == {"items": [{"name": "a"}, {"name": "b", "extra": "x"}]}
    assert decode(_Holder, encoded) == held
