"""A migration names its artifact's tag only when a decision rests on it (``needs_tags``).

Its interests, what the worker observes on every wake, hold pods only: a wake while the
agent works (each progress annotation is one) decides nothing about the artifact, and a
registry request per wake cost ~9 per migration. The tag is asked for when the agent
reports the push, when the source goes, at the deadline, before the source is deleted
(gate 1) and after the artifact's delete.
"""

from __future__ import annotations

from controlplane.machines.contract import protocol
from controlplane.machines.migration.machine import MigrationDecider
from tests.machines.machines_gwt import (
    NS,
    POD,
    T0,
    Given,
    at,
    captured_source,
    migration_artifact,
    migration_body,
    observe,
    pod,
)

MID = "mig-1"
ART, DIGEST, PINNED, GOOD = migration_artifact(MID)
SRC = f"{NS}/{POD}"
D = MigrationDecider()


def requested() -> Given:
    return Given(D, MID, D.validate_spec(migration_body({}))).decided(observe({SRC: pod()}), T0)


def working(state: str, digest: str = "") -> dict[str, str]:
    """The source's annotations while the agent reports ``state``."""
    return {**captured_source(MID).annotations, protocol.REPORT_CHECKPOINT_ID: MID,
            protocol.REPORT_STATE: state, protocol.REPORT_DIGEST: digest}


def test_no_phase_of_a_migration_observes_the_registry_on_every_wake() -> None:
    g = requested()
    assert g.state.phase == "Checkpointing"
    assert D.interests(g.state).tags == frozenset()


def test_a_wake_while_the_agent_captures_needs_nothing_from_the_registry() -> None:
    then = requested().when(observe({SRC: pod(annotations=working("Capturing"))}), at(1))
    then.then_idle()
    assert then.decision.needs_tags == frozenset()


def test_the_agents_push_report_asks_for_the_artifact_then_verifies_it() -> None:
    g = requested()
    pushed = pod(annotations=working("Pushed", DIGEST))
    g = g.decided(observe({SRC: pushed}), at(2))  # CaptureReported
    then = g.when(observe({SRC: pushed}), at(2))
    assert then.decision.needs_tags == frozenset({ART})
    g.when(observe({SRC: pushed}, {ART: GOOD}), at(2)).then_events("ArtifactVerified")


def test_a_source_gone_before_any_report_looks_for_a_pushed_artifact_first() -> None:
    then = requested().when(observe({SRC: None}), at(3))
    assert then.decision.needs_tags == frozenset({ART})
    requested().when(observe({SRC: None}, {ART: None}), at(3)).then_events("CaptureFailed")


def test_the_source_is_deleted_only_after_the_artifact_is_looked_up_in_that_decision() -> None:
    g = requested().decided(observe({SRC: captured_source(MID)}, {ART: GOOD}), at(4))
    assert g.state.phase == "DeletingSource"
    then = g.when(observe({SRC: captured_source(MID)}), at(5))
    assert then.decision.needs_tags == frozenset({PINNED})
    assert then.decision.actions == ()
