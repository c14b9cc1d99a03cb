"""``cpctl checkpoints [NAMESPACE/POD]``: the checkpoints there are to restore from,
newest first, and whether ``cpctl restore`` can use each (read from the store by
:func:`controlplane.app.checkpoints.list_checkpoints`: no cluster or registry access).

Registered by :mod:`controlplane.cli.main`, which calls :func:`add_arguments` for the
flags and :func:`checkpoints_cmd` to run it; the store is imported by the latter only, so
parsing stays light.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TextIO

from controlplane.cli import render
from controlplane.cli.context import clock, opened
from controlplane.cli.options import add_registry_options, positive_int
from controlplane.errors import UsageError

if TYPE_CHECKING:
    from controlplane.app.checkpoints import Listed

DEFAULT_LIMIT = 100

EPILOG = """\
columns: node, where it was captured; class, its name (else its repository); size, of
the checkpoint archives as the manifest declared it (- when it did not); age, since the
registry verified it; sealed, whether its layers are encrypted (docs/security.md).
--wide adds artifact, pinned by digest, names the key ids a sealed checkpoint is
encrypted for, and prints every value whole.
restorable: `cpctl restore ID` takes it (a checkpoint's or a suspend's capture, not a
migration's) and the store records no garbage collection deleting its artifact (a
migration's, once its restore is verified); no says why in two words (no: deleted, no:
being deleted, no: a migration), --wide and -o json in a sentence. Only the store is
read: an artifact removed from the registry by other means still shows yes (`cpctl
restore ID --node N --dry-run` probes the registry).

examples:
  cpctl checkpoints                          # every verified capture, newest first
  cpctl checkpoints default/web --restorable # what default/web can be restored from
  cpctl checkpoints --wide                   # with artifacts, key ids, reasons whole
  cpctl checkpoints default/web -o json      # every field: sizes in bytes, times ISO
  cpctl restore ID --node node-2             # ID: the first column
  cpctl checkpoints --unrecorded             # in the registry, not in the history
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", nargs="?", metavar="NAMESPACE/POD",
                   help="only the checkpoints of this workload (default: every workload)")
    p.add_argument("--restorable", action="store_true",
                   help="only the checkpoints `cpctl restore` can use (see below)")
    p.add_argument("--limit", type=positive_int, default=DEFAULT_LIMIT, metavar="N",
                   help=f"show the newest N (default {DEFAULT_LIMIT}); the table says when "
                   "more match, and -o json|yaml carry {items, total, limit}")
    p.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table",
                   help="json/yaml: {\"items\": [...], \"total\": N, \"limit\": N}, each item "
                   "with every field (size_bytes, verified_at ISO, not_restorable_because)")
    p.add_argument("--wide", action="store_true",
                   help="add the artifact and the key ids a sealed checkpoint is encrypted "
                   "for, say why not restorable in a sentence, and print every value whole; "
                   "by default the table fits the terminal's width (id and workload never "
                   "cut, a cut value ending in …)")
    found = p.add_argument_group(
        "checkpoints the history does not record (after a restore from a backup)")
    found.add_argument("--unrecorded", action="store_true",
                       help="list the checkpoints in the registry whose operation the history "
                       "does not record, found by the provenance in their manifests (reads "
                       "the registry; the --registry-* flags say how to reach it)")
    found.add_argument("--repository", action="append", default=[], metavar="REGISTRY/REPO",
                       help="with --unrecorded: look in this repository (repeatable; default: "
                       "every repository the recorded checkpoints are in)")
    found.add_argument("--collect", action="store_true",
                       help="with --unrecorded: delete what it lists (by digest; manifests "
                       "without our provenance are never touched)")
    add_registry_options(found)
    p.epilog = EPILOG


async def checkpoints_cmd(args: argparse.Namespace) -> int:
    if args.collect and not args.unrecorded:
        raise UsageError("--collect deletes what --unrecorded lists: give both",
                         hint="cpctl checkpoints --unrecorded  # first: what it would delete")
    if args.unrecorded:
        if args.workload is not None or args.restorable:
            raise UsageError("--unrecorded lists by repository: it takes no NAMESPACE/POD "
                             "or --restorable", hint="cpctl checkpoints --unrecorded "
                             "--repository REGISTRY/REPO")
        from controlplane.cli.unrecorded import unrecorded_cmd
        return await unrecorded_cmd(args)
    from controlplane.app.checkpoints import list_checkpoints
    from controlplane.app.requests import RequestRefused
    from controlplane.machines.base.requests import Fields, SubmissionRejected
    from controlplane.store import migrate

    workload = None
    if args.workload is not None:
        try:
            workload = "/".join(Fields({"workload": args.workload}).workload())
        except SubmissionRejected as exc:
            raise RequestRefused(str(exc), field=exc.field, hint=exc.hint or "") from None
    async with opened(args) as db:
        await migrate.require_current(db)
        found, total = await list_checkpoints(db, workload=workload,
                                              restorable_only=args.restorable,
                                              limit=args.limit)
    if args.output in ("json", "yaml"):
        render.structured({"items": [c.to_json() for c in found], "total": total,
                           "limit": args.limit}, args.output)
        return 0
    if not found:
        print(_none_found(workload, restorable=args.restorable))
        return 0
    print_table(found, clock.now(), wide=args.wide)
    if total > len(found):  # stderr: a pipe reading the table stays clean
        sys.stderr.write(f"showing the newest {len(found)} of {total}; --limit N shows more\n")
    return 0


def print_table(found: Sequence[Listed], now: datetime, *, wide: bool,
                out: TextIO | None = None, width: int | None = None) -> None:
    """The table of ``found``: its id (what `cpctl restore` takes), workload (what a
    reader looks for) and whether it is restorable never cut; the rest gives way to fit
    ``width`` (default: the terminal's), which 110 columns is for the usual names.
    ``wide``: the artifact too, every value whole."""
    headers = ["id", "workload", "node", "class", "size", "age", "sealed", "restorable"]
    if wide:
        headers.append("artifact")
    render.table(headers, [_row(c, now, wide=wide) for c in found], out, max_width=256,
                 width=width, wide=wide, whole=[0, 1, 7])


def _row(c: Listed, now: datetime, *, wide: bool) -> tuple[str, ...]:
    common = (c.checkpoint_id, c.workload or "-", c.node or "-", c.klass or "-",
              human_size(c.size_bytes), render.age(c.verified_at, now))
    if not wide:
        return (*common, "yes" if c.sealed_for else "no",
                "yes" if c.why_not_briefly is None else f"no: {c.why_not_briefly}")
    return (*common, ",".join(c.sealed_for) if c.sealed_for else "no",
            "yes" if c.why_not is None else f"no: {c.why_not}", c.artifact)


def _none_found(workload: str | None, *, restorable: bool) -> str:
    what = "restorable checkpoints" if restorable else "checkpoints"
    if workload is None:
        return f"no {what} recorded"
    if restorable:
        return (f"no restorable checkpoints of {workload} (`cpctl checkpoints {workload}` "
                "lists every capture of it, and why it cannot be restored)")
    return f"no checkpoints of {workload} (make one with `cpctl checkpoint {workload}`)"


def human_size(size_bytes: int | None) -> str:
    """``512 B``, ``3.2 KiB``, ``41 MiB``, ``1.5 GiB``; ``-`` when the size is unknown."""
    if size_bytes is None:
        return "-"
    value, unit = float(size_bytes), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    if unit == "B":
        return f"{size_bytes} B"
    return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
