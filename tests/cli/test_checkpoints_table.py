"""The ``cpctl checkpoints`` table at a 110-column terminal: every column's value whole
for the usual names (a 36-character id, a sealed suspend, a collected migration), the
reason not restorable in two words, and ``--wide`` adding the artifact, the key ids and
the reason as a sentence."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

from controlplane.app.checkpoints import Listed, why_not_restorable
from controlplane.cli.checkpoints import print_table
from controlplane.machines.stages.collect import ArtifactDeleted

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
ARTIFACT = "registry.example:5000/checkpoints@sha256:" + "ab" * 32


def _listed(kind: str, workload: str, *, gc_event: str | None = None,
            sealed_for: tuple[str, ...] = (), node: str = "node-1") -> Listed:
    return Listed(checkpoint_id="f0d8069c-1308-480d-beea-3ce4aa2aec12", kind=kind,
                  phase="Succeeded", workload=workload, node=node, klass="sealed",
                  size_bytes=41 * 1024 * 1024, artifact=ARTIFACT, tag=None,
                  verified_at=NOW - timedelta(minutes=3), gc_event=gc_event, gc_at=None,
                  why_not=why_not_restorable(kind, gc_event), sealed_for=sealed_for)


FOUND = [_listed("migration", "default/payments-api", gc_event=ArtifactDeleted.NAME),
         _listed("suspend", "sandbox/notebook-7f3a", sealed_for=("k1-3f9a2c41d0e8",)),
         _listed("checkpoint", "default/web")]


def _table(*, wide: bool, width: int | None = 110, found: list[Listed] = FOUND) -> list[str]:
    out = io.StringIO()
    print_table(found, NOW, wide=wide, out=out, width=width)
    return out.getvalue().splitlines()


def test_the_default_table_fits_110_columns_with_nothing_cut() -> None:
    lines = _table(wide=False)
    assert max(len(line) for line in lines) <= 110, lines
    assert not any("…" in line for line in lines), lines
    assert lines[0].split() == ["ID", "WORKLOAD", "NODE", "CLASS", "SIZE", "AGE", "SEALED",
                                "RESTORABLE"]
    moved, suspended, checkpointed = (line.split(maxsplit=7) for line in lines[1:])
    assert moved[1] == "default/payments-api"
    assert moved[7].endswith("no: deleted")
    assert suspended[7].split()[-2:] == ["yes", "yes"]  # sealed, restorable
    assert checkpointed[7].split()[-2:] == ["no", "yes"]


def test_a_long_node_name_gives_way_before_the_workload_and_the_verdict() -> None:
    node = "ip-10-0-1-23.eu-west-1.compute.internal"
    found = [_listed("migration", "default/payments-api", gc_event=ArtifactDeleted.NAME,
                     node=node)]
    _, row = _table(wide=False, found=found)
    assert len(row) <= 110, row
    assert "default/payments-api" in row
    assert row.endswith("no: deleted")
    assert node not in row
    assert node[:6] in row


def test_a_capture_of_a_kind_restore_does_not_take_says_so_in_two_words() -> None:
    listed = _listed("migration", "default/web")
    assert listed.why_not_briefly == "a migration"
    assert "checkpoints and suspends" in str(listed.why_not)


def test_wide_adds_the_artifact_key_ids_and_the_whole_reason() -> None:
    lines = _table(wide=True, width=None)
    assert lines[0].split()[-1] == "ARTIFACT"
    assert all(line.endswith(ARTIFACT) for line in lines[1:])
    assert "k1-3f9a2c41d0e8" in lines[2]
    assert "no: deleted by garbage collection after the migration's verified restore" \
        in lines[1]
