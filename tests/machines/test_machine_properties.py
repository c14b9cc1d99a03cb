"""Property tests: random interleavings of world changes, faults and commands.

For each product machine, hypothesis draws a script of observations and faults (the pod
vanishes or is recreated with another UID; tags appear late, stale or with the wrong
provenance; registry and API probes fail; actions fail for good (ActionFailed), are lost
in a crash after the commit, are performed twice, or the whole decision is lost before
the commit; retargets, cancels; time jumps past deadlines). :class:`machines_sim.Run`
checks the safety invariants on every decision (see its docstring); each test then
checks that replay reproduces the state, and that once the faults stop the machine
reaches a terminal phase (no hang).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.engine.observation import NodeView, PodView
from controlplane.machines.checkpoint.machine import CheckpointDecider
from controlplane.machines.contract import protocol
from controlplane.machines.migration.machine import MigrationDecider
from controlplane.machines.restore.machine import RestoreDecider
from controlplane.machines.resume.machine import ResumeDecider
from controlplane.machines.suspend.machine import SuspendDecider
from tests.machines.machines_gwt import T0, TEMPLATE, digest_of, manifest
from tests.machines.machines_sim import Run, World, play

REPO = "registry.example.com/ckpt"
KEY = "apps/web"
UID = "uid-src"
FAST = {"capture": 120, "release": 60, "delete": 90, "schedule": 60, "restore": 150,
        "gc": 900}
PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

PROGRESS = st.tuples(st.just("progress"), st.none())
CHAOS = st.one_of(
    PROGRESS, PROGRESS, PROGRESS,
    st.tuples(st.just("lose_artifact"), st.none()),
    st.tuples(st.just("advance"), st.integers(1, 200)),
    st.tuples(st.just("agent"), st.sampled_from(["push", "push_silent", "report_only",
                                                  "fail", "stale", "late_tag"])),
    st.tuples(st.just("restore_agent"), st.sampled_from(["ok", "fail", "stale_identity",
                                                         "bind_only"])),
    st.tuples(st.sampled_from(["reap", "vanish", "recreate", "vanish_restored",
                               "lose_artifact", "fail_actions", "drop_actions", "discard",
                               "duplicate", "cancel"]), st.none()),
    st.tuples(st.just("cordon"), st.sampled_from(["n1", "n2", "n3"])),
    st.tuples(st.just("probe"), st.sampled_from([("pods",), ("tags",), ("nodes",),
                                                 ("pods", "tags", "nodes")])),
    st.tuples(st.just("retarget"), st.sampled_from(["n1", "n2", "n3", "n9"])),
)
SCRIPTS = st.lists(CHAOS, max_size=30)


def cluster() -> World:
    source = PodView("apps", "web", UID, "n1", "Running", ready=True,
                     annotations={protocol.INSTANCE_ID: "inst-src"})
    return World(pods={KEY: source}, nodes={n: NodeView(n, ready=True)
                                            for n in ("n1", "n2", "n3")})


def klass(on_failure: str = "Resume", keep: bool = False) -> dict[str, Any]:
    return {"repository": REPO, "timeouts": FAST, "on_failure": on_failure,
            "retention": {"delete_after_migration": not keep}, "restore_attempts": 2}


def finish(run: Run) -> None:
    run.settle()
    run.check_replay()


@PROPS
@given(script=SCRIPTS, on_failure=st.sampled_from(["Resume", "Kill"]), keep=st.booleans())
def test_migration_is_safe_under_any_interleaving(script: list[tuple[str, Any]],
                                                  on_failure: str, keep: bool) -> None:
    """Gates 1-7 hold for every decision; replay reproduces; the migration always ends."""
    spec = {"pod": {"namespace": "apps", "name": "web", "uid": UID}, "source_node": "n1",
            "target_node": "n2", "template": TEMPLATE, "class": klass(on_failure, keep)}
    run = Run(MigrationDecider(), "mig-1", spec, cluster(), source_uid=UID)
    play(run, script, source_key=KEY)
    finish(run)
    state = run.state
    gone = any(e.type in ("SourceDeleted", "SourceVanished") for e in run.history)
    if gone:
        # Gate 6: once the source is gone the restore finishes somewhere, or the machine
        # fails with the artifact preserved (never GC'd) for a manual restore.
        assert state.phase in ("Succeeded", "RolledBack", "Cancelled",
                               "GarbageCollectionFailed") or (
            state.phase == "Failed" and state.failure.reason == "RestoreFailed"
            and not any(e.type == "ArtifactDeletionRequested" for e in run.history))
    if state.phase == "Succeeded":
        assert any(e.type in ("ArtifactDeleted", "ArtifactKept") for e in run.history)
        assert state.conditions == ()


@PROPS
@given(script=SCRIPTS)
def test_forbidden_gc_is_retried_visibly_and_never_reported_as_success(
        script: list[tuple[str, Any]]) -> None:
    """Gate 7: with manifest deletes refused (403), a restored migration never Succeeds."""
    spec = {"pod": {"namespace": "apps", "name": "web", "uid": UID}, "source_node": "n1",
            "target_node": "n2", "template": TEMPLATE, "class": klass()}
    run = Run(MigrationDecider(), "mig-1", spec, cluster(), source_uid=UID)
    run.faults.forbidden = frozenset({"DeleteManifest"})
    play(run, script, source_key=KEY)
    finish(run)
    failures = [e for e in run.history if e.type == "ArtifactDeletionFailed"]
    vanished = any(e.type == "ArtifactDeleted" for e in run.history)  # lost by other means
    if any(e.type == "ArtifactDeletionRequested" for e in run.history) and not vanished:
        assert failures
        assert run.state.phase == "GarbageCollectionFailed"
        assert [c.type for c in run.state.conditions] == ["GarbageCollectionFailed"]
        retries = [e for e in run.history if e.type == "ArtifactDeletionRequested"]
        assert len(retries) > 1, "a failed GC is retried"


@PROPS
@given(script=SCRIPTS, on_failure=st.sampled_from(["Resume", "Kill"]), quiesce=st.booleans())
def test_checkpoint_is_safe_under_any_interleaving(script: list[tuple[str, Any]],
                                                   on_failure: str, quiesce: bool) -> None:
    """A checkpoint never deletes its source unless it failed and the class says Kill."""
    spec = {"pod": {"namespace": "apps", "name": "web", "uid": UID}, "quiesce": quiesce,
            "class": klass(on_failure)}
    run = Run(CheckpointDecider(), "ckpt-1", spec, cluster(), source_uid=UID)
    play(run, script, source_key=KEY)
    finish(run)
    if run.state.phase == "Succeeded":
        assert run.state.artifact is not None
        assert any(e.type == "ArtifactVerified" for e in run.history)


@PROPS
@given(script=SCRIPTS)
def test_suspend_is_safe_under_any_interleaving(script: list[tuple[str, Any]]) -> None:
    """Suspend deletes the pod only with a verified artifact present; it always ends."""
    spec = {"pod": {"namespace": "apps", "name": "web", "uid": UID}, "template": TEMPLATE,
            "class": klass()}
    run = Run(SuspendDecider(), "susp-1", spec, cluster(), source_uid=UID)
    play(run, script, source_key=KEY)
    finish(run)
    if run.state.phase == "Suspended":
        assert run.state.artifact is not None


CANDIDATE = st.tuples(st.sampled_from(["present", "absent", "foreign"]), st.booleans())


@PROPS
@given(script=SCRIPTS, candidates=st.lists(CANDIDATE, max_size=3))
def test_resume_never_cold_boots_over_an_unreadable_checkpoint(
        script: list[tuple[str, Any]], candidates: list[tuple[str, bool]]) -> None:
    """Cold boot only after every candidate was seen absent or foreign (never on errors)."""
    world = cluster()
    world.pods.clear()
    listed: list[dict[str, Any]] = []
    for i, (kind, with_id) in enumerate(candidates):
        digest = digest_of(f"cand-{i}")
        ref = f"{REPO}@{digest}"
        if kind != "absent":
            cid = f"ckpt-{i}" if kind == "present" else "other"
            world.tags[ref] = manifest(ref, digest, checkpoint_id=cid)
        listed.append({"artifact": ref, "checkpoint_id": f"ckpt-{i}" if with_id or
                       kind == "foreign" else None})
    spec = {"namespace": "apps", "name": "web", "node": "n2", "template": TEMPLATE,
            "candidates": listed, "class": klass()}
    run = Run(ResumeDecider(), "resume-1", spec, world)
    play(run, script)
    finish(run)
    chosen = [e for e in run.history if e.type == "ColdBootChosen"]
    skipped = {e.data["index"] for e in run.history if e.type == "CandidateSkipped"}
    if chosen:
        assert skipped == set(range(len(candidates)))


@PROPS
@given(script=SCRIPTS, present=st.sampled_from(["present", "absent", "foreign"]))
def test_restore_is_safe_under_any_interleaving(script: list[tuple[str, Any]],
                                                present: str) -> None:
    """A restore succeeds only with a fresh identity from the digest; it always ends."""
    world = cluster()
    world.pods.clear()
    digest = digest_of("ckpt-r")
    ref = f"{REPO}@{digest}"
    if present != "absent":
        world.tags[ref] = manifest(ref, digest, checkpoint_id="ckpt-r" if present == "present"
                                   else "other")
    spec = {"artifact": ref, "namespace": "apps", "name": "web-r", "node": "n2",
            "template": TEMPLATE, "checkpoint_id": "ckpt-r", "source_instance": "inst-src",
            "class": klass()}
    run = Run(RestoreDecider(), "restore-1", spec, world)
    play(run, script)
    finish(run)
    if run.state.phase == "Succeeded":
        assert present == "present"
        assert run.state.instance_id not in (None, "", "inst-src")


def test_world_starts_at_the_fixed_epoch() -> None:
    """The simulated clock is the tests' fixed epoch (no wall clock anywhere)."""
    assert cluster().now == T0
