"""``cpctl history``'s "why" column: facts as readable ``key=value`` text that fits."""

from __future__ import annotations

from controlplane.cli.why import facts_text, fit

POD_FACTS = {"pod default/app": {"pod": "default/app", "pod_deleting": False,
                                 "pod_node": "node-1", "pod_phase": "Running",
                                 "pod_uid": "u-1"}}


def test_nested_facts_read_as_key_value_pairs_with_the_object_first() -> None:
    assert facts_text(POD_FACTS) == (
        "pod=default/app pod_phase=Running pod_deleting=false pod_node=node-1 pod_uid=u-1")


def test_flat_facts_and_booleans_read_plainly() -> None:
    assert facts_text({"pod": "default/app", "pod_present": False}) == (
        "pod=default/app pod_present=false")


def test_values_with_spaces_are_quoted_and_missing_ones_shown_as_a_dash() -> None:
    text = facts_text({"error_message": "403 Forbidden", "error_class": None})
    assert text == 'error_class=- error_message="403 Forbidden"'


def test_a_pair_repeated_by_two_objects_is_shown_once() -> None:
    facts = {"pod default/app": {"pod": "default/app", "pod_node": "node-1"},
             "pod_node": "node-1"}
    assert facts_text(facts) == "pod=default/app pod_node=node-1"


def test_two_objects_that_differ_keep_both_values() -> None:
    facts = {"pod default/a": {"pod": "default/a", "pod_phase": "Running"},
             "pod default/b": {"pod": "default/b", "pod_phase": "Pending"}}
    assert facts_text(facts) == ("pod=default/a pod=default/b pod_phase=Running "
                                 "pod_phase=Pending")


def test_an_unnamed_nested_object_keeps_its_key_as_a_prefix() -> None:
    assert facts_text({"limits": {"max": 2}}) == "limits.max=2"


def test_no_facts_is_an_empty_text() -> None:
    assert facts_text({}) == ""


def test_fit_cuts_with_an_ellipsis_only_when_needed() -> None:
    assert fit("abcdef", 6) == "abcdef"
    assert fit("abcdefg", 6) == "abcde…"
    assert fit("abc", 0) == "abc"


def test_a_uid_comes_after_the_names_a_reader_knows_the_object_by() -> None:
    """A drain's ChildStarted: the pod and the child read first, the UID last."""
    text = facts_text({"uid": "78fb250a", "child": "d-1", "pod": "default/app",
                       "target": "node-1"})
    assert text == "child=d-1 pod=default/app target=node-1 uid=78fb250a"


def test_an_event_with_an_empty_reason_says_its_data_instead() -> None:
    """ChildFinished of a child that succeeded has reason "": its pod, target and phase
    are what ``history`` shows, not an empty line."""
    from controlplane.cli.reading import _reason

    said = _reason({"at": "2026-01-01T00:00:00Z", "child": "d-1", "pod": "default/app",
                    "target": "node-1", "phase": "Succeeded", "reason": ""})
    assert said == "phase=Succeeded child=d-1 pod=default/app target=node-1"
    assert _reason({"reason": "Drained", "message": "moved 1 pods"}) == \
        "Drained: moved 1 pods"
