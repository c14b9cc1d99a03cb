"""``cpctl replay``: fold every history again and compare it with its projection
(``--verify`` re-makes each recorded decision too), or rebuild the projections."""

from __future__ import annotations

import argparse
import json
import os
from contextlib import closing
from typing import TYPE_CHECKING

from controlplane.cli.context import clock, opened

if TYPE_CHECKING:
    from controlplane.app.replay import ReplayReport


def _print_report(report: ReplayReport, title: str) -> None:
    print(f"{title}: {report.machines} machines, {report.events} events, "
          f"{report.decisions} decisions"
          + (f" re-made ({report.not_redecided} engine records not re-decided)"
             if report.not_redecided else "")
          + f", {len(report.mismatches)} mismatches"
          + (f", {report.rewritten} projections rewritten" if report.rewritten else ""))
    for m in report.mismatches[:50]:
        print(f"  {m.machine_id} seq {m.seq} {m.what}: expected {json.dumps(m.expected)} "
              f"got {json.dumps(m.actual)}")


async def replay_cmd(args: argparse.Namespace) -> int:
    from controlplane.app.replay import auto_jobs, rebuild, verify
    from controlplane.cli.meter import RebuildMeter
    from controlplane.machines.catalog import default_kinds
    from controlplane.store import migrate, replay_reads

    kinds = default_kinds()
    dirty = False
    async with opened(args) as db:
        await migrate.require_current(db)
        jobs = args.jobs or auto_jobs(await replay_reads.count_machines(db),
                                      os.cpu_count() or 1)
        title = "rebuild" if args.rebuild else "projections"
        with closing(RebuildMeter(title)) as meter:
            report = await rebuild(db, kinds, now=clock.now(), write=args.rebuild,
                                   jobs=jobs, progress=meter)
        _print_report(report, title)
        dirty |= not report.clean and not args.rebuild
        if args.verify:
            with closing(RebuildMeter("verify")) as meter:
                vreport = await verify(db, kinds, jobs=jobs, progress=meter)
            _print_report(vreport, "verify")
            dirty |= not vreport.clean
            print(_verdict(report, vreport, rebuilt=args.rebuild))
    return 5 if dirty else 0


def _verdict(projections: ReplayReport, decisions: ReplayReport, *, rebuilt: bool) -> str:
    """The run in one plain sentence, as the demo ends."""
    stale = projections.rewritten if rebuilt else len(projections.mismatches)
    return (f"{_count(projections.machines, 'operation')} replayed: "
            f"{_count(stale, 'projection')} "
            f"{'rewritten' if rebuilt else 'that disagree with their history'}, "
            f"{_count(len(decisions.mismatches), 'decision')} that would now differ")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"
