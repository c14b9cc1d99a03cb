"""Where a rebuild's time goes, per event: reading, folding, comparing (one process).

``python -m bench.replay_split [--parts 8] [--part 0]``, on the history ``bench.replay``
loaded (``cp_bench_replay``; run that first): takes one of ``--parts`` id ranges (the
shares a parallel rebuild would hand its processes) and times, one after the other,
with the cyclic collector paused as a rebuild runs:

1. read: ``replay_reads.stream_events`` over the range (rows, JSON decoded);
2. fold: ``replay.replay_machine`` of every machine (``initial_state`` + ``evolve``);
3. compare: ``replay``'s check of each folded state against its stored projection
   (``to_json`` included);
4. of the fold, ``initial_state`` alone.

CPU seconds of this process (PostgreSQL's share of the read is not in it), per event and
per machine. A rebuild is these three interleaved, so their sum is its CPU per event in
one process; ``docs/performance.md`` keeps the latest split. Prints a table and one JSON
line; writes ``bench/results/replay_split.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from bench.common import db_name, write_results
from controlplane.collector import collector_paused
from controlplane.machines.registry import default_kinds
from controlplane.replay import _projection_differences, replay_machine
from controlplane.store import replay_reads
from controlplane.store.database import open_database


async def split(*, parts: int, part: int) -> dict[str, Any]:
    if not 0 <= part < parts:
        raise SystemExit(f"--part must be in 0..{parts - 1} for --parts {parts}, got {part}")
    db = open_database(f"postgresql://postgres@127.0.0.1:5432/{db_name('replay')}",
                       pool_size=2)
    kinds = default_kinds()
    try:
        ranges = await replay_reads.split_ids(db, parts)
        after, until = ranges[min(part, len(ranges) - 1)]
        with collector_paused():
            c0 = time.process_time()
            items = [x async for x in replay_reads.stream_events(db, after=after, until=until)]
            c1 = time.process_time()
            folded = [replay_machine(kinds, record, history) for record, history in items]
            c2 = time.process_time()
            mismatches = sum(len(_projection_differences(record, state, version))
                             for (record, _), (state, version) in zip(items, folded,
                                                                      strict=True))
            c3 = time.process_time()
            for record, history in items:
                spec = history[0].data.get("spec", {})
                assert isinstance(spec, dict)
                kinds.get(record.kind).initial_state(record.id, spec)
            c4 = time.process_time()
    finally:
        await db.dispose()
    events = sum(len(e) for _, e in items)
    if not events:
        raise SystemExit(f"no events in {db_name('replay')}: run python -m bench.replay first")
    seconds = {"read": c1 - c0, "fold": c2 - c1, "compare": c3 - c2, "initial_state": c4 - c3}
    return {"parts": parts, "part": part, "machines": len(items), "events": events,
            "mismatches": mismatches,
            "cpu_s": {k: round(v, 3) for k, v in seconds.items()},
            "us_per_event": {k: round(v / events * 1e6, 2) for k, v in seconds.items()},
            "us_per_machine": {k: round(v / len(items) * 1e6, 1) for k, v in seconds.items()}}


def print_table(r: dict[str, Any]) -> None:
    print(f"replay_split: part {r['part']} of {r['parts']}: {r['machines']:,} machines, "
          f"{r['events']:,} events, mismatches {r['mismatches']}")
    for what in ("read", "fold", "compare", "initial_state"):
        label = "  (of the fold) initial_state" if what == "initial_state" else f"  {what}"
        print(f"{label:<32}{r['us_per_event'][what]:>7.2f} us/event "
              f"{r['us_per_machine'][what]:>8.1f} us/machine")


async def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.replay_split", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", type=int, default=8, metavar="N",
                   help="split the machines into N id ranges (default: %(default)s)")
    p.add_argument("--part", type=int, default=0, metavar="K",
                   help="time range K of them, from 0 (default: %(default)s)")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="write the JSON here instead of bench/results/replay_split.json")
    args = p.parse_args()
    results = await split(parts=args.parts, part=args.part)
    print_table(results)
    write_results("replay_split", results, args.json)


if __name__ == "__main__":
    asyncio.run(main())
