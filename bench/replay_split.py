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

CPU seconds of this process per event and per machine, and PostgreSQL's CPU while it
served the read (every local ``postgres`` process, sampled: other activity on the server
counts too, so run it on an otherwise idle one). A rebuild is these interleaved, so their
sum is its CPU per event; divided into the machine's cores, each part (and the sum) gives
a ceiling: the events/s a rebuild could reach on this machine if only that part cost CPU
and every core were busy with it. ``docs/performance.md`` keeps the latest split. Prints
a table and one JSON line; writes ``bench/results/replay_split.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

from bench.common import PostgresCpuSampler, db_name, write_results
from controlplane.app.replay import _projection_differences, replay_machine
from controlplane.gc_tuning import collector_paused
from controlplane.machines.catalog import default_kinds
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
            server = PostgresCpuSampler()
            server.start()
            c0 = time.process_time()
            items = [x async for x in replay_reads.stream_events(db, after=after, until=until)]
            c1 = time.process_time()
            server_read = await server.stop()
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
    seconds = {"read": c1 - c0, "read_postgres": server_read, "fold": c2 - c1,
               "compare": c3 - c2, "initial_state": c4 - c3}
    per_event = {k: v / events * 1e6 for k, v in seconds.items()}
    cores = os.cpu_count() or 1
    # initial_state is part of the fold: the whole is read (both sides) + fold + compare.
    whole = sum(per_event[k] for k in ("read", "read_postgres", "fold", "compare"))
    parts_alone = {k: v for k, v in per_event.items() if k != "initial_state"}
    return {"parts": parts, "part": part, "machines": len(items), "events": events,
            "mismatches": mismatches, "cores": cores,
            "cpu_s": {k: round(v, 3) for k, v in seconds.items()},
            "us_per_event": {k: round(v, 2) for k, v in per_event.items()},
            "us_per_machine": {k: round(v / len(items) * 1e6, 1) for k, v in seconds.items()},
            "us_per_event_whole": round(whole, 2),
            "ceiling_events_per_s": {**{k: _ceiling(v, cores) for k, v in parts_alone.items()},
                                     "whole": _ceiling(whole, cores)}}


def _ceiling(us_per_event: float, cores: int) -> int | None:
    """Events/s with ``cores`` cores all busy at ``us_per_event`` of CPU per event; None
    when the part used too little CPU to measure (a tiny history: /proc counts in ticks)."""
    return int(cores * 1e6 / us_per_event) if us_per_event > 0 else None


def print_table(r: dict[str, Any]) -> None:
    print(f"replay_split: part {r['part']} of {r['parts']}: {r['machines']:,} machines, "
          f"{r['events']:,} events, mismatches {r['mismatches']}")
    labels = {"read": "read (this process)", "read_postgres": "read (PostgreSQL)",
              "fold": "fold", "compare": "compare", "initial_state": "(of the fold) initial_state"}
    ceiling = r["ceiling_events_per_s"]
    print(f"  {'CPU':<30}{'us/event':>9}{'us/machine':>12}   events/s on {r['cores']} "
          "core(s) if only this cost CPU")
    for what, label in labels.items():
        alone = "" if what not in ceiling else (
            f"{ceiling[what]:>12,}" if ceiling[what] is not None else f"{'-':>12}")
        print(f"  {label:<30}{r['us_per_event'][what]:>9.2f}{r['us_per_machine'][what]:>12.1f}"
              f"   {alone}")
    whole = ceiling["whole"]
    print(f"  {'the whole rebuild':<30}{r['us_per_event_whole']:>9.2f}{'':>12}   "
          f"{whole if whole is None else format(whole, ','):>12}")


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
