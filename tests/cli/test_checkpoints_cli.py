"""``cpctl checkpoints [NAMESPACE/POD]`` over a history the product wrote (a simulated
cluster, node agents, a worker and the verbs that act as subprocesses; the listings read
through ``cpctl``'s own ``main``, and ``--limit`` and a bad workload in a process of their
own, as ``test_terminal_output.py`` reads the table on a pseudo-terminal): a checkpoint
and a suspend are restorable, with the node they were captured on, class, size and
pinned artifact; a migration's capture is not, and the row says its artifact was
garbage-collected; a workload filters; a bad workload exits 2; an unknown one says so;
``-o json`` carries every field; ``--limit`` says what it cut; and the id printed is one
``cpctl restore`` accepts. The parser's examples parse."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from controlplane.cli.main import build_parser
from drivers.sealing.keys import generate_keypair
from tests.cli.processes import MARKER, REPO, Deployment, deployed
from tests.support.cpctl import in_process

HEADERS = ["ID", "WORKLOAD", "NODE", "CLASS", "SIZE", "AGE", "SEALED", "RESTORABLE"]
WIDE = [*HEADERS, "ARTIFACT"]


def table_rows(text: str, headers: list[str] = HEADERS) -> list[dict[str, str]]:
    """A table's rows by column, cut at the header's column starts (cells hold spaces:
    ``10 KiB``, ``no: ...``)."""
    header, *lines = text.splitlines()
    assert header.split() == headers, header
    starts = [header.index(h) for h in headers] + [None]
    return [{h.lower(): line[starts[i]:starts[i + 1]].strip() for i, h in enumerate(headers)}
            for line in lines]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with deployed(tmp_path) as d:
        yield d


def run_ok(d: Deployment, *args: str) -> str:
    done = d.cpctl(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def listed(d: Deployment, *args: str) -> str:
    """A listing read by ``cpctl``'s ``main`` in this process (an interpreter start per
    read cost ~2 CPU s on a loaded machine; the verbs that act stay processes)."""
    done = in_process(d.db, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


@pytest.mark.slow
def test_checkpoints_lists_what_can_be_restored_and_why_not(deployment: Deployment) -> None:
    d = deployment
    d.pod("app", "node-1")
    d.pod("sandbox", "node-2")
    d.pod("mover", "node-1")
    checkpoint_id = run_ok(d, "checkpoint", "default/app", "--repository", REPO, "--wait",
                           *d.cluster_args()).split()[0]
    key = generate_keypair(d.tmp / "keys" / "r.pem", d.tmp / "keys" / "r.pub")
    classes = d.tmp / "classes.yaml"
    classes.write_text(json.dumps({"classes": [{
        "name": "sealed", "repository": REPO,
        "encryption": {"recipients": [f"file:{d.tmp / 'keys' / 'r.pub'}"],
                       "keyFile": str(d.tmp / "keys" / "r.pem")}}]}))
    suspend_id = run_ok(d, "suspend", "default/sandbox", "--class", "sealed", "--classes-file",
                        str(classes), "--wait", *d.cluster_args()).split()[0]
    migration_id = run_ok(d, "migrate", "default/mover", "--to", "node-3", "--repository",
                          REPO, "--wait", "--wait-seconds", "60", *d.cluster_args()).split()[0]

    rows = table_rows(listed(d, "checkpoints"))
    assert [r["id"] for r in rows] == [migration_id, suspend_id, checkpoint_id]
    moved, suspended, checkpointed = rows
    for row, workload, node, klass in [(checkpointed, "default/app", "node-1", "default"),
                                       (suspended, "default/sandbox", "node-2", "sealed")]:
        assert (row["workload"], row["node"], row["class"], row["restorable"]) == (
            workload, node, klass, "yes")
        assert re.fullmatch(r"\d+(\.\d)? (B|KiB|MiB)", row["size"]), row
        assert re.fullmatch(r"\d+[smhd]", row["age"]), row
    assert (checkpointed["sealed"], suspended["sealed"]) == ("no", "yes")
    assert (moved["workload"], moved["node"]) == ("default/mover", "node-1")
    assert moved["restorable"] == "no: deleted"

    # --wide: the artifact, the key ids, the reason whole; the same rows otherwise
    wide = table_rows(listed(d, "checkpoints", "--wide"), WIDE)
    assert [(r["id"], r["workload"], r["size"]) for r in wide] == [
        (r["id"], r["workload"], r["size"]) for r in rows]
    wide_moved, wide_suspended, wide_checkpointed = wide
    for row in (wide_suspended, wide_checkpointed):
        assert re.fullmatch(re.escape(REPO) + r"@sha256:[0-9a-f]{64}", row["artifact"]), row
    assert (wide_checkpointed["sealed"], wide_suspended["sealed"]) == ("no", key)
    assert wide_moved["restorable"] == ("no: deleted by garbage collection after the "
                                        "migration's verified restore")

    only_app = table_rows(listed(d, "checkpoints", "default/app"))
    assert [r["id"] for r in only_app] == [checkpoint_id]

    restorable_json = json.loads(listed(d, "checkpoints", "--restorable", "-o", "json"))
    assert (restorable_json["total"], restorable_json["limit"]) == (2, 100)
    assert [i["id"] for i in restorable_json["items"]] == [suspend_id, checkpoint_id]
    item = restorable_json["items"][1]
    assert set(item) == {"id", "kind", "phase", "workload", "node", "class", "size_bytes",
                         "artifact", "tag", "verified_at", "gc_event", "gc_at", "restorable",
                         "not_restorable_because", "encrypted", "sealed_for"}
    assert restorable_json["items"][0]["sealed_for"] == [key]
    assert (item["encrypted"], item["sealed_for"]) == (False, [])
    assert (item["kind"], item["workload"], item["node"], item["class"]) == (
        "checkpoint", "default/app", "node-1", "default")
    assert isinstance(item["size_bytes"], int)
    assert item["size_bytes"] > 0
    assert f"{item['size_bytes'] // 1024} KiB" == checkpointed["size"]
    assert item["artifact"] == wide_checkpointed["artifact"]
    assert datetime.fromisoformat(item["verified_at"]).tzinfo is not None
    assert (item["restorable"], item["not_restorable_because"]) == (True, None)
    [gone] = json.loads(listed(d, "checkpoints", "default/mover", "-o", "json"))["items"]
    assert (gone["restorable"], gone["gc_event"]) == (False, "ArtifactDeleted")

    cut = d.cpctl("checkpoints", "--limit", "1")
    assert cut.returncode == 0, cut.stderr
    assert [r["id"] for r in table_rows(cut.stdout)] == [migration_id]
    assert cut.stderr.strip() == "showing the newest 1 of 3; --limit N shows more"

    bad = d.cpctl("checkpoints", "app")
    assert bad.returncode == 2
    assert bad.stderr.strip() == ("cpctl: error: workload: 'app' is not NAMESPACE/POD "
                                  "(e.g. default/web)")
    unknown = in_process(d.db, "checkpoints", "default/ghost")
    assert unknown.returncode == 0, unknown.stderr
    assert unknown.stdout.startswith("no checkpoints of default/ghost")
    none_restorable = listed(d, "checkpoints", "default/mover", "--restorable")
    assert none_restorable.startswith("no restorable checkpoints of default/mover")

    # The id listed is the one to restore from; the migration's is refused, as listed.
    [restorable] = table_rows(listed(d, "checkpoints", "default/app", "--restorable"))
    restored = d.cpctl("restore", restorable["id"], "--node", "node-3", "--name", "app-copy",
                       "--wait", "--wait-seconds", "60", *d.cluster_args())
    assert restored.returncode == 0, restored.stdout + restored.stderr
    copy = next(p for p in d.pods() if p["metadata"]["name"] == "app-copy")
    assert copy["metadata"]["annotations"][MARKER] == "app=1"
    refused = d.cpctl("restore", migration_id, "--node", "node-3", *d.cluster_args())
    assert refused.returncode == 2
    assert "not a checkpoint" in refused.stderr


def test_every_example_in_its_help_parses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["checkpoints", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "restorable: `cpctl restore ID` takes it" in text
    lines = [line.strip() for line in text.split("examples:")[1].splitlines()
             if line.strip().startswith("cpctl ")]
    assert len(lines) == 6
    for line in lines:
        command = re.split(r"\s+#\s*", line)[0].replace("ID", "some-id")
        assert build_parser().parse_args(shlex.split(command)[1:]).handler is not None
