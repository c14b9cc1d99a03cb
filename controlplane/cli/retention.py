"""``cpctl history prune`` and ``cpctl history import``, beside ``cpctl history ID``.

``main`` routes ``history prune|import ...`` here (:func:`route`) before parsing, so
``cpctl history ID`` stays exactly as it was; the work is ``store/retention.py``'s, shared
with the worker's housekeeping. Also what ``cpctl history ID`` prints for an operation a
prune replaced by its summary row (:func:`print_pruned`). The parser imports this module
(:func:`route`, :func:`add_parsers`): the store and the machines are imported by the
verbs that use them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane.cli import render
from controlplane.cli.context import clock, opened
from controlplane.cli.options import positive_int
from controlplane.errors import UsageError

if TYPE_CHECKING:
    from controlplane.frontdoor.ports import Faults
    from controlplane.store.retention import Policy

VERBS = ("prune", "import")
#: Global options of ``cpctl`` that take a value (``route`` skips them to find the verb).
_VALUED = ("--db", "--log-format", "--log-level")
#: The fault point after each progress line (a crash test SIGKILLs the prune there,
#: e.g. after ``phase 1 (summaries): batch 1``, to prove a crash loses nothing; see
#: :mod:`controlplane.wiring.faults` for how a test injects it).
PROGRESS = "prune.progress"

PRUNE_HELP = """examples:
  cpctl history prune --keep-days 90                  # every kind: settled > 90 days ago
  cpctl history prune --keep-days 30 --keep-days drain=365
  cpctl history prune --keep-days 90 --archive /backup/history --dry-run

Only settled operations are pruned (terminal, actions performed, no lease, no wake). Each
keeps one summary row, so `cpctl report` and /summary add up the same; `cpctl history ID`
prints it. A class's history_keep_days wins over --keep-days. Progress goes to stderr. A
crash (or Ctrl-C) loses nothing: run the command again and it finishes (docs/retention.md).
"""
IMPORT_HELP = """examples:
  cpctl history import /backup/history                      # every *.jsonl.gz in it
  cpctl history import /backup/history/history-0123abcd.jsonl.gz

Puts archived operations back (machine, events, decisions) and removes their summary
rows; an operation already present is left as it is, so importing twice is harmless.
"""


def route(argv: Sequence[str]) -> list[str]:
    """``history prune|import ...`` -> ``history-prune|history-import ...``; any other
    command line unchanged (``history ID`` included)."""
    out, i = list(argv), 0
    while i < len(out):
        token = out[i]
        if token in _VALUED:
            i += 2
        elif token.startswith("-"):
            i += 1
        else:
            if token == "history" and i + 1 < len(out) and out[i + 1] in VERBS:
                out[i:i + 2] = [f"history-{out[i + 1]}"]
            break
    return out


def add_parsers(sub: Any) -> None:
    """The two verbs, unlisted in ``cpctl --help`` (``cpctl history --help`` names them)."""

    def verb(name: str, handler: Callable[[argparse.Namespace], Any], text: str, *,
             prog: str, epilog: str) -> argparse.ArgumentParser:
        sp: argparse.ArgumentParser = sub.add_parser(
            name, description=text, epilog=epilog, prog=prog,
            formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.set_defaults(handler=handler)
        return sp

    p = verb("history-prune", prune_cmd,
             "replace the history of settled operations older than the policy by one "
             "summary row each (events, decisions and machine rows deleted)",
             prog="cpctl history prune", epilog=PRUNE_HELP)
    p.add_argument("--keep-days", action="append", default=[], metavar="[KIND=]N",
                   help="keep N days of history; KIND=N for one kind (repeat: "
                   "--keep-days 30 --keep-days drain=365). Age counts from when the "
                   "operation settled")
    p.add_argument("--archive", metavar="DIR", type=Path,
                   help="first write each pruned operation's machine, events and decisions "
                   "to DIR as JSON Lines (gzip), one file per batch; `cpctl history import` "
                   "reads them back")
    p.add_argument("--dry-run", action="store_true",
                   help="count what would be pruned; change nothing")
    p.add_argument("--batch", type=positive_int, default=500, metavar="N",
                   help="operations per transaction (default 500)")
    i = verb("history-import", import_cmd,
             "put archived operations back from a `cpctl history prune --archive` file or "
             "directory", prog="cpctl history import", epilog=IMPORT_HELP)
    i.add_argument("path", metavar="PATH", type=Path,
                   help="an archive file (*.jsonl.gz) or a directory of them")


def parse_policy(values: Sequence[str], *, flag: str = "--keep-days") -> Policy:
    """``["90", "drain=365"]`` -> the policy; a ``UsageError`` naming the flag if wrong."""
    from controlplane.machines.catalog import default_kinds
    from controlplane.store import retention

    default: int | None = None
    by_kind: dict[str, int] = {}
    kinds = default_kinds()
    for value in values:
        kind, _, days_text = value.rpartition("=")
        try:
            days = int(days_text)
        except ValueError:
            days = -1
        if days < 0 or days > 36_600:
            raise UsageError(f"{flag} {value!r}: the number of days must be a whole number "
                             "from 0 to 36600", hint=f"e.g. {flag} 90 or {flag} drain=365")
        if not kind:
            default = days
        elif kind not in kinds:
            raise UsageError(f"{flag} {value!r}: {kind!r} is not a kind",
                             hint="kinds: " + ", ".join(kinds))
        else:
            by_kind[kind] = days
    return retention.Policy(default_days=default, by_kind=by_kind)


async def prune_cmd(args: argparse.Namespace, *, faults: Faults | None = None) -> int:
    """``faults``: only a crash test passes any (:mod:`controlplane.wiring.faults`)."""
    from controlplane.store import migrate, retention

    def progress(line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        if faults is not None:
            faults.reached(PROGRESS, line)

    policy = parse_policy(args.keep_days)
    if args.archive is not None and args.archive.exists() and not args.archive.is_dir():
        raise UsageError(f"--archive {str(args.archive)!r} is not a directory",
                         hint="give a directory (it is created if missing)")
    async with opened(args) as db:
        await migrate.require_current(db)
        report = await retention.prune(db, policy=policy, now=clock.now(), batch=args.batch,
                                       archive=args.archive, dry_run=args.dry_run,
                                       progress=progress)
    if args.dry_run:
        print(f"dry run: {report.summarized} operation(s) would be pruned "
              f"({'--keep-days ' + ' '.join(args.keep_days) if args.keep_days else 'class '}"
              f"policy); nothing changed")
        return 0
    print(f"pruned {report.summarized} operation(s): {report.events_deleted} event(s), "
          f"{report.decisions_deleted} decision(s), {report.machines_deleted} machine row(s) "
          f"deleted, {len(report.partitions_dropped)} partition(s) dropped"
          + (f"; archived to {len(report.archives)} file(s) in {args.archive}"
             if report.archives else "")
          + (f"; {report.revived} came back to life and kept their history"
             if report.revived else ""))
    if not policy.configured and report.summarized == 0:
        print("no --keep-days given: only classes with history_keep_days were considered",
              file=sys.stderr)
    return 0


def _archives(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(path.glob("*.jsonl.gz"))
        if not found:
            raise UsageError(f"PATH {str(path)!r} holds no *.jsonl.gz archive",
                             hint="give the directory `cpctl history prune --archive` wrote")
        return found
    if not path.is_file():
        raise UsageError(f"PATH {str(path)!r} does not exist",
                         hint="give an archive file or the directory holding them")
    return [path]


async def import_cmd(args: argparse.Namespace) -> int:
    from controlplane.store import migrate, retention

    files = _archives(args.path)
    imported = present = 0
    async with opened(args) as db:
        await migrate.require_current(db)
        for path in files:
            try:
                items = retention.read_archive(path)
            except (OSError, ValueError, EOFError) as exc:
                raise UsageError(f"PATH {str(path)!r} is not a readable history archive: "
                                 f"{exc}", hint="give a file `cpctl history prune --archive` "
                                 "wrote") from None
            for item in items:
                if await retention.import_archived(db, item):
                    imported += 1
                else:
                    present += 1
    print(f"imported {imported} operation(s) from {len(files)} file(s)"
          + (f"; {present} already present, left as they are" if present else ""))
    return 0


def print_pruned(row: dict[str, Any], output: str) -> None:
    """``cpctl history ID`` of a pruned operation: its summary, and that it was pruned."""
    fields = {k: v for k, v in row.items() if k != "milestones"}
    if output in ("json", "yaml"):
        render.structured({"pruned": True, "summary": {**fields,
                                                       "milestones": row["milestones"]}},
                          output)
        return
    print(f"{row['machine_id']}: pruned at {row['pruned_at']} (its events and decisions were "
          "removed by `cpctl history prune`; this is its summary row; `cpctl history import` "
          "puts an archived history back)")
    render.table(["field", "value"], list(fields.items()), max_width=120, wide=True)
