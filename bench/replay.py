"""Replay: rebuild every projection from 1M events on PostgreSQL, events/s.

``python -m bench.replay [--events 1000000]`` (``make bench-replay``), on a fresh
``cp_bench_replay`` database:

1. template histories: a few real migrations on the simulator (:func:`bench.scale.
   run_scale` into this database), so the events, facts and decisions replayed are the
   product's own, not a synthetic kind;
2. bulk load: the template machines, their events and decisions cloned under fresh ids
   (renamed in this process, sent with ``COPY``) until the events table holds
   ``--events`` rows; ``ANALYZE``;
3. the read alone (machines + events decoded, no fold: what a log-reading figure such
   as the eventsourcing library's measures), timed;
4. ``controlplane.app.replay.rebuild`` (what ``cpctl replay`` runs): fold every machine's
   events from its ``Submitted`` spec and compare with the stored projection, timed;
   every projection must match;
5. with ``--verify``: ``controlplane.app.replay.verify`` (``cpctl replay --verify``) re-runs
   every recorded decision, timed; the clones are faithful enough that none differs;
6. the reference, in the same run (``--reference``, :mod:`bench.reference_log`): the
   eventsourcing library writes as many events of the same size into its own log (or,
   with ``--reuse``, reuses the one an earlier run wrote), reads the log back, and
   reconstructs every aggregate (``full``, the default; ``read``: the reads only); the
   rebuild is printed as a ratio of each.

Prints the bare commit floor of the same run, a table (with the CPU the rebuild used:
its own processes, and PostgreSQL's) and one JSON line; writes
``bench/results/replay.json``. The target: above the eventsourcing library's
log read, which was ~200k events/s on the machine the target was set on (a machine
2-3x faster than some it runs on now, hence the same-run reference).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import text

from bench.common import (
    PostgresCpuSampler,
    db_name,
    floors,
    footprint,
    mib,
    own_cpu_seconds,
    peak_rss_bytes,
    write_results,
)
from bench.reference_log import measure_reference
from bench.scale import run_scale
from controlplane.app.replay import auto_jobs, rebuild, verify
from controlplane.clock import SystemClock
from controlplane.gc_tuning import collector_paused
from controlplane.logs import configure as configure_logs
from controlplane.machines.catalog import default_kinds
from controlplane.store import codec, replay_reads
from controlplane.store.database import Database, json_dumps, open_database

DB_NAME = db_name("replay")
CHUNK = 250  # copies per INSERT
URL = f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}"
clock = SystemClock()


async def _columns(db: Database, table: str, *, skip: tuple[str, ...] = ()
                   ) -> list[tuple[str, str]]:
    async with db.reader.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = :t ORDER BY ordinal_position"), {"t": table})).all()
    return [(str(c), str(t)) for c, t in rows if c not in skip]


def _pod_tag(machine_id: str) -> str:
    """The part of a restored pod's name hashed from its machine's id."""
    return "-r" + hashlib.sha256(machine_id.encode()).hexdigest()[:6] + "-"


def _renamed(value: Any, kind: str, old: str, new: str, shift: timedelta) -> Any:
    """One column of a template row as the clone ``new`` of machine ``old`` holds it,
    its times moved by ``shift``."""
    if kind in ("json", "jsonb"):  # JSON null (a compressed value's plain column) stays
        text_ = json_dumps(value)
        return text_.replace(old, new).replace(_pod_tag(old), _pod_tag(new))
    if value is None:
        return None
    if kind.startswith("timestamp"):
        return value + shift
    if kind == "bytea":  # compressed JSON (store.codec): decoded, renamed, encoded again
        text_ = json_dumps(codec.decode(bytes(value)))
        return codec.encode(orjson.loads(
            text_.replace(old, new).replace(_pod_tag(old), _pod_tag(new))))
    return value


async def clone(db: Database, copies: int, *, spread: timedelta = timedelta(0)) -> None:
    """``copies`` more of every machine (ids ``<n>-<id>``), with events and decisions;
    copy ``n`` of ``copies`` happened ``spread * n / copies`` earlier (its row times are
    moved back by that much: a history that grew over ``spread``).

    A faithful clone: the machine id also appears inside the JSON (checkpoint ids,
    artifact tags), so it is replaced there too, as if the machine had that id; so is
    the hash of it that names a restored pod (restoring.restore_pod_name: "-r" +
    sha256(id)[:6] + "-"), or re-running the decisions (verify) would name the pod
    differently than the clone's history does. The compressed columns (revision 0007)
    cannot be rewritten in SQL: their rows are renamed here and sent with COPY.
    """
    async with db.reader.connect() as conn:
        template = [str(i) for i in (await conn.execute(text("SELECT id FROM machines")))
                    .scalars()]
    for table, skip in (("machines", ()), ("events", ("position",)), ("decisions", ())):
        cols = await _columns(db, table, skip=skip)
        key = "id" if table == "machines" else "machine_id"
        names = [c for c, _ in cols]
        async with db.reader.connect() as conn:
            rows = (await conn.execute(text(
                f"SELECT {', '.join(names)} FROM {table} WHERE {key} = ANY(:ids)"),
                {"ids": template})).all()
        if not rows:
            continue
        for first in range(1, copies + 1, CHUNK):
            batch = []
            for g in range(first, min(copies, first + CHUNK - 1) + 1):
                for row in rows:
                    old = str(row._mapping[key])
                    new = f"{g:07d}-{old}"
                    shift = -spread * g / copies
                    batch.append(tuple(new if c == key else _renamed(v, kind, old, new, shift)
                                       for (c, kind), v in zip(cols, row, strict=True)))
            async with db.writer.begin() as conn:
                raw = (await conn.get_raw_connection()).driver_connection
                assert raw is not None
                await raw.copy_records_to_table(table, records=batch, columns=names)
    async with db.writer.begin() as conn:
        for table in ("machines", "events", "decisions"):
            await conn.execute(text(f"ANALYZE {table}"))


async def load_history(*, events: int, template_migrations: int = 20) -> dict[str, Any]:
    """``cp_bench_replay`` holding ~``events`` events: real migrations, cloned."""
    template = await run_scale(migrations=template_migrations, nodes=4, db_name=DB_NAME,
                               measure_floor=False)
    assert template["succeeded"] == template_migrations, template["phases"]
    db = open_database(URL, pool_size=4)
    try:
        per_copy = template["db"]["events"]["rows"]
        copies = max(0, -(-events // per_copy) - 1)
        t0 = time.perf_counter()
        await clone(db, copies)
        return {"template_migrations": template_migrations,
                "load_s": round(time.perf_counter() - t0, 1), "db": await footprint(db)}
    finally:
        await db.dispose()


async def loaded(events: int) -> dict[str, Any] | None:
    """The history already in the database if it holds ``events`` (``--reuse``)."""
    try:
        db = open_database(URL, pool_size=2)
        try:
            found = await footprint(db)
        finally:
            await db.dispose()
    except Exception:  # no such database (or no schema): load it
        return None
    if found["events"]["rows"] < events:
        return None
    return {"template_migrations": None, "load_s": None, "db": found, "reused": True}


async def run_replay(*, events: int, template_migrations: int = 20,
                     measure_floor: bool = True, reuse: bool = False,
                     jobs: int | None = None, verify_too: bool = False,
                     reference: str = "full") -> dict[str, Any]:
    results = (reuse and await loaded(events)) or await load_history(
        events=events, template_migrations=template_migrations)
    db = open_database(URL, pool_size=8)
    try:
        if measure_floor:
            results.update(await floors(db, quick=True))
        t0 = time.perf_counter()  # the read alone (what the eventsourcing figure is)
        with collector_paused():  # as the rebuild reads
            read = sum([len(evs) async for _r, evs in replay_reads.stream_events(db)])
        results["read_events_per_s"] = round(read / (time.perf_counter() - t0))
        kinds = default_kinds()
        postgres = PostgresCpuSampler()
        postgres.start()
        cpu0, t0 = own_cpu_seconds(), time.perf_counter()
        if jobs is None:  # what `cpctl replay` would pick for this history here
            jobs = auto_jobs(await replay_reads.count_machines(db), os.cpu_count() or 1)
        report = await rebuild(db, kinds, now=clock.now(), jobs=jobs)
        elapsed = time.perf_counter() - t0
        results["cpu_s"] = {"replay": round(own_cpu_seconds() - cpu0, 3),
                            "postgres": await postgres.stop()}
        if verify_too:  # every recorded decision re-run (cpctl replay --verify)
            t1 = time.perf_counter()
            checked = await verify(db, kinds, jobs=jobs)
            results["verify"] = {
                "decisions": checked.decisions, "mismatches": len(checked.mismatches),
                "seconds": round(time.perf_counter() - t1, 2),
                "events_per_s": round(checked.events / (time.perf_counter() - t1))}
    finally:
        await db.dispose()
    if reference != "none":  # after ours: the two never share the CPU
        results["reference"] = await asyncio.to_thread(
            measure_reference, report.events, reuse=reuse,
            reconstruct_too=reference == "full")
    results.update({
        "machines": report.machines, "events": report.events,
        "rebuild_s": round(elapsed, 2), "jobs": jobs,
        "events_per_s": round(report.events / elapsed),
        "machines_per_s": round(report.machines / elapsed),
        "mismatches": len(report.mismatches),
        "rss_peak_bytes": peak_rss_bytes(),
    })
    return results


def print_table(r: dict[str, Any]) -> None:
    how = ("an already loaded history" if r.get("reused") else
           f"clones of {r['template_migrations']} real migrations; load {r['load_s']} s")
    print(f"replay: rebuild of {r['machines']} machines, {r['events']} events ({how})")
    if "floor_c1_per_s" in r:
        print(f"  bare INSERT+COMMIT floor   c=1 {r['floor_c1_per_s']:.0f}/s   "
              f"c=32 {r['floor_c32_per_s']:.0f}/s")
    print(f"  read only (decode)         {r['read_events_per_s']:,} events/s")
    print(f"  rebuild, {r['jobs']} process(es)     {r['rebuild_s']:.1f} s: "
          f"{r['events_per_s']:,} events/s,"
          f" {r['machines_per_s']:,} machines/s; mismatches {r['mismatches']}")
    cpu = r["cpu_s"]
    print(f"  CPU during the rebuild     replay {cpu['replay']} s, PostgreSQL {cpu['postgres']} s"
          f" ({(cpu['replay'] + cpu['postgres']) / r['events'] * 1e6:.1f} us per event)")
    if "verify" in r:
        v = r["verify"]
        print(f"  verify, same processes     {v['seconds']:.1f} s: {v['events_per_s']:,} events/s,"
              f" {v['decisions']:,} decisions re-run; mismatches {v['mismatches']}")
    print(f"  peak RSS                   {mib(r['rss_peak_bytes'])}")
    if "reference" in r:
        _print_reference(r)


def _print_reference(r: dict[str, Any]) -> None:
    ref = r["reference"]
    ours = r["events_per_s"]
    print(f"  reference, same run: {ref['library']} ({ref['events']:,} events in its own "
          f"log, page {ref['page_size']:,})")
    rows = [("reads its log", ref["read_log_events_per_s"]),
            ("reads + decodes", ref["read_decode_events_per_s"]),
            ("reconstructs", ref["reconstruct_events_per_s"])]
    for what, rate in rows:
        if rate is not None:
            print(f"    {what:<23}{rate:>8,} events/s; our rebuild is {ours / rate:.2f}x that")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--template", type=int, default=20, help="real migrations to clone")
    p.add_argument("--reuse", action="store_true",
                   help="rebuild the history already loaded (e.g. by bench.growth) if it "
                        "holds --events events")
    p.add_argument("--jobs", type=int, default=None,
                   help="rebuild processes (cpctl replay --jobs; default: what cpctl replay "
                        "picks for this history, one per CPU from 20,000 machines)")
    p.add_argument("--verify", action="store_true",
                   help="also re-run every recorded decision (cpctl replay --verify), timed")
    p.add_argument("--reference", choices=("full", "read", "none"), default="full",
                   help="the eventsourcing library on the same events count, after the "
                        "rebuild (bench.reference_log): full = reads its log and "
                        "reconstructs every aggregate (default), read = reads only, none")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    configure_logs("console", "warning")
    results = await run_replay(events=args.events, template_migrations=args.template,
                               reuse=args.reuse, jobs=args.jobs, verify_too=args.verify,
                               reference=args.reference)
    print_table(results)
    write_results("replay", results, args.json)


if __name__ == "__main__":
    asyncio.run(main())
