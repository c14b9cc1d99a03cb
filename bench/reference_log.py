"""The replay target's reference: the eventsourcing library reading its own PostgreSQL log.

Replay's target is set against "the eventsourcing library reads its log at ~200k
events/s"; a figure from another machine does not read well here, so this measures the
library on this machine, in this run, as :func:`bench.common.floors` does the bare commit
rate. ``python -m bench.reference_log [--events 1000000]``, on a fresh ``cp_bench_eslog``
database (``$BENCH_DB_PREFIX`` replaces ``cp_bench``):

1. write: an ``Application`` of the library's, persisting through ``eventsourcing.postgres``
   (psycopg 3), saves aggregates of ``--events-per-aggregate`` events (a ``Started``, then
   ``Stepped``s), each carrying ~``--payload-bytes`` of JSON-ish data, a few hundred
   aggregates per ``app.save`` (one transaction); timed, progress on stderr; then
   ``VACUUM ANALYZE`` (untimed: a log at rest has been vacuumed);
2. read the log: ``recorder.select_notifications`` paged to the end (the library's own
   application-log API, what its subscriptions and process applications page through),
   rows to ``Notification`` objects, not decoded: "reads its log";
3. read and decode: the same pages, each notification mapped to its domain event (topic
   resolved, JSON state decoded): what a projection reading the log pays;
4. reconstruct: ``app.repository.get`` of every aggregate (one query each, events decoded
   and folded into the aggregate), each checked for its expected version: the like-for-like
   comparison with ``controlplane.app.replay.rebuild``. One thread, as the library's repository
   is synchronous; ``--reconstruct-sample N`` takes every k-th aggregate instead of all.

The library runs with its defaults (JSON transcoder, no cipher, no compressor, no aggregate
cache) and snapshotting OFF, so every reconstruction folds every event. Prints a table and
one JSON line; writes ``bench/results/reference_log.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterator, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from bench.common import db_name, fresh_database, own_cpu_seconds, write_results

HOST, PORT, USER = "127.0.0.1", "5432", "postgres"
#: Rows per ``select_notifications``. Best of 5 over 60,000 events here: 65k events/s at
#: 100, 70k at 500 (its subscriptions' page), 81k at 1,000, 83k at 10,000, 88k at 100,000
#: (within noise of 10,000); the NotificationLogReader's default section of 10 reads ~4x
#: slower. Client CPU per event is flat from 100 up: past ~1,000 only round trips shrink.
PAGE_SIZE = 10_000
#: Aggregates per ``app.save``: one transaction of ~2,400 events at 12 per aggregate.
SAVE_BATCH = 200
PROGRESS_EVERY_S = 10.0


class CheckpointHistory(Aggregate):
    """A machine's history in the library's idiom: ``@event`` methods are both the command
    that records the event and the fold that applies it on reconstruction."""

    @event("Started")
    def __init__(self, payload: dict[str, Any]) -> None:
        self.node = str(payload["node"])
        self.steps = 0
        self.last: dict[str, Any] = payload

    @event("Stepped")
    def step(self, payload: dict[str, Any]) -> None:
        self.steps += 1
        self.node = str(payload["node"])
        self.last = payload


class ReferenceLog(Application[UUID]):
    """Snapshotting off (the class default, set again here so it is visible): a
    reconstruction folds every event, as a rebuild does."""

    name = "ReferenceLog"
    is_snapshotting_enabled = False


def library_env(dbname: str) -> dict[str, str]:
    """The library's documented configuration keys. Passed to the application, they take
    precedence over ``os.environ`` (which is merged under them)."""
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": dbname,
        "POSTGRES_HOST": HOST,
        "POSTGRES_PORT": PORT,
        "POSTGRES_USER": USER,
        "POSTGRES_PASSWORD": "",  # trust auth; the key must be present all the same
        "POSTGRES_CONNECT_TIMEOUT": "10",
        "CREATE_TABLE": "y",
        "IS_SNAPSHOTTING_ENABLED": "n",
        "AGGREGATE_CACHE_MAXSIZE": "",  # no cache: every get reads the database
        "COMPRESSOR_TOPIC": "",
        "CIPHER_TOPIC": "",
        "CIPHER_KEY": "",  # a CIPHER_KEY alone would switch AES encryption on
    }


def make_payload(aggregate: int, step: int, size: int) -> dict[str, Any]:
    """JSON-ish event data (nested dict, strings, numbers, a list), padded so its compact
    JSON is ``size`` bytes when ``size`` exceeds the fixed part."""
    data: dict[str, Any] = {
        "kind": "checkpoint", "step": step, "node": f"node-{aggregate % 97:03d}",
        "pod": f"ns-{aggregate % 13}/app-{aggregate:07d}",
        "facts": {"bytes": 4096 * (step + 1), "tags": [f"t{step}", f"a{aggregate % 7}"],
                  "ok": True},
        "note": "",
    }
    fixed = len(json.dumps(data, separators=(",", ":")))
    data["note"] = "x" * max(0, size - fixed)
    return data


def _batches(events: int, per_aggregate: int) -> Iterator[list[int]]:
    """Event counts of the aggregates, ``SAVE_BATCH`` at a time (the last one short)."""
    counts = [per_aggregate] * (events // per_aggregate)
    if events % per_aggregate:
        counts.append(events % per_aggregate)
    for first in range(0, len(counts), SAVE_BATCH):
        yield counts[first:first + SAVE_BATCH]


def populate(app: ReferenceLog, *, events: int, events_per_aggregate: int,
             payload_bytes: int) -> list[tuple[UUID, int]]:
    """Save the aggregates through the library; their ids and expected versions."""
    written: list[tuple[UUID, int]] = []
    started = last_report = time.perf_counter()
    done = 0
    for counts in _batches(events, events_per_aggregate):
        batch = []
        for count in counts:
            n = len(written)
            history = CheckpointHistory(payload=make_payload(n, 0, payload_bytes))
            for step in range(1, count):
                history.step(payload=make_payload(n, step, payload_bytes))
            batch.append(history)
            written.append((history.id, count))
        app.save(*batch)
        done += sum(counts)
        now = time.perf_counter()
        if now - last_report >= PROGRESS_EVERY_S:
            last_report = now
            print(f"reference_log: wrote {done:,}/{events:,} events "
                  f"({done / (now - started):,.0f}/s)", file=sys.stderr, flush=True)
    return written


def read_log(app: ReferenceLog, *, page_size: int, decode: bool = False) -> int:
    """Page through the whole application log; the number of notifications read."""
    read, last = 0, 0
    while True:
        page = app.recorder.select_notifications(start=last, limit=page_size,
                                                 inclusive_of_start=False)
        if decode:
            for notification in page:
                app.mapper.to_domain_event(notification)
        read += len(page)
        if len(page) < page_size:
            return read
        last = page[-1].id


def reconstruct(app: ReferenceLog, expected: Sequence[tuple[UUID, int]]) -> tuple[int, int]:
    """Get every aggregate through the repository: (events folded, wrong versions).

    Run with asserts on, as applications run: on Python 3.11 about a third of this time is
    the library's ``assert isinstance(event, CanMutateProtocol)`` per event (a
    runtime-checkable Protocol, slow before 3.12); ``python -O`` reconstructs ~1.5x faster.
    """
    folded = wrong = 0
    for aggregate_id, count in expected:
        history: CheckpointHistory = app.repository.get(aggregate_id)
        folded += history.version
        wrong += history.version != count or history.steps != count - 1
    return folded, wrong


def _timed_rate(count: int, started: float) -> int:
    return round(count / (time.perf_counter() - started))


def _log_at_rest(conninfo: str, table: str) -> dict[str, int]:
    """VACUUM ANALYZE the log (as autovacuum would at rest) and size it."""
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"VACUUM ANALYZE {table}".encode())
        row = conn.execute(f"SELECT count(*), coalesce(avg(length(state)), 0), "
                           f"pg_total_relation_size('{table}') FROM {table}".encode()).fetchone()
    assert row is not None
    return {"rows": int(row[0]), "state_bytes_avg": round(float(row[1])),
            "total_bytes": int(row[2])}


def _existing_log(dbname: str, table: str) -> list[tuple[UUID, int]] | None:
    """The aggregates (id, version) of a log an earlier run left, or None if there is none."""
    try:
        with psycopg.connect(f"postgresql://{USER}@{HOST}:{PORT}/{dbname}",
                             connect_timeout=10) as conn:
            rows = conn.execute(f"SELECT originator_id, max(originator_version) FROM {table} "
                                f"GROUP BY originator_id ORDER BY originator_id".encode()
                                ).fetchall()
    except psycopg.Error:  # no such database or table: write the log
        return None
    return [(UUID(str(aggregate)), int(version)) for aggregate, version in rows]


def measure_reference(events: int, *, events_per_aggregate: int = 12, payload_bytes: int = 288,
                      page_size: int = PAGE_SIZE, reconstruct_sample: int | None = None,
                      compare_page_sizes: Sequence[int] = (), reuse: bool = False,
                      reconstruct_too: bool = True) -> dict[str, Any]:
    """Write ``events`` through the library, then time its log read and its reconstruction.

    ``reconstruct_sample``: reconstruct every k-th aggregate so that about that many are
    (None: all of them). ``compare_page_sizes``: also time a raw read at each of these.
    ``reuse``: read the log an earlier run wrote if it holds ``events`` events (the write is
    then not timed). ``reconstruct_too=False`` times the reads only.
    """
    dbname = db_name("eslog")
    table = f"{ReferenceLog.name.lower()}_events"
    found = _existing_log(dbname, table) if reuse else None
    reused = found is not None and sum(version for _, version in found) >= events
    write_s: float | None = None
    if reused:
        assert found is not None
        expected = found
        conninfo = f"postgresql://{USER}@{HOST}:{PORT}/{dbname}"
    else:
        conninfo = asyncio.run(fresh_database(dbname))
    app = ReferenceLog(env=library_env(dbname))
    try:
        if not reused:
            t0 = time.perf_counter()
            expected = populate(app, events=events, events_per_aggregate=events_per_aggregate,
                                payload_bytes=payload_bytes)
            write_s = time.perf_counter() - t0
        written = sum(count for _, count in expected)
        log = _log_at_rest(conninfo, table)

        cpu0, t0 = own_cpu_seconds(), time.perf_counter()
        read = read_log(app, page_size=page_size)
        read_rate, read_cpu = _timed_rate(read, t0), own_cpu_seconds() - cpu0

        t0 = time.perf_counter()
        decoded = read_log(app, page_size=page_size, decode=True)
        decoded_rate = _timed_rate(decoded, t0)

        by_page = {}
        for size in compare_page_sizes:
            t0 = time.perf_counter()
            by_page[str(size)] = _timed_rate(read_log(app, page_size=size), t0)

        step = max(1, len(expected) // reconstruct_sample) if reconstruct_sample else 1
        sample = expected[::step] if reconstruct_too else []
        cpu0, t0 = own_cpu_seconds(), time.perf_counter()
        folded, wrong = reconstruct(app, sample)
        rebuild_s = time.perf_counter() - t0
        rebuild_cpu = own_cpu_seconds() - cpu0
    finally:
        app.close()
    results: dict[str, Any] = {
        "library": f"eventsourcing {version('eventsourcing')}",
        "driver": f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__})",
        "database": dbname, "table": table,
        "events": written, "aggregates": len(expected),
        "events_per_aggregate": events_per_aggregate, "payload_bytes": payload_bytes,
        "save_batch_aggregates": SAVE_BATCH, "log": log,
        "reused": reused,
        "write_s": None if write_s is None else round(write_s, 2),
        "write_events_per_s": None if write_s is None else round(written / write_s),
        "page_size": page_size,
        "read_log_events": read, "read_log_events_per_s": read_rate,
        "read_log_cpu_s": round(read_cpu, 2),
        "read_decode_events": decoded, "read_decode_events_per_s": decoded_rate,
        "reconstruct_scope": ("none" if not reconstruct_too else
                              "all" if step == 1 else f"1 in {step} aggregates"),
        "reconstructed_aggregates": len(sample), "reconstructed_events": folded,
        "reconstruct_version_mismatches": wrong,
        "reconstruct_s": round(rebuild_s, 2),
        "reconstruct_events_per_s": round(folded / rebuild_s) if sample else None,
        "reconstruct_aggregates_per_s": round(len(sample) / rebuild_s) if sample else None,
        "reconstruct_cpu_s": round(rebuild_cpu, 2),
    }
    if by_page:
        results["read_log_events_per_s_by_page_size"] = by_page
    return results


def print_table(r: dict[str, Any]) -> None:
    log = r["log"]
    print(f"reference_log: {r['library']} on PostgreSQL ({r['driver']}), snapshotting off")
    print(f"  log                  {r['events']:,} events in {r['aggregates']:,} aggregates, "
          f"{log['state_bytes_avg']} B state/event avg, {log['total_bytes'] / 2**20:.0f} MiB")
    if r["write_s"] is None:
        print("  write                (reused the log an earlier run wrote)")
    else:
        print(f"  write                {r['write_s']:.1f} s: {r['write_events_per_s']:,} "
              f"events/s ({r['save_batch_aggregates']} aggregates per save)")
    print(f"  read log, page {r['page_size']:<6,}{r['read_log_events_per_s']:>10,} events/s "
          f"(select_notifications; CPU {r['read_log_cpu_s']} s)")
    print(f"  read + decode        {r['read_decode_events_per_s']:>10,} events/s "
          f"(notifications to domain events)")
    for size, rate in r.get("read_log_events_per_s_by_page_size", {}).items():
        print(f"    read log, page {int(size):<6,}{rate:>8,} events/s")
    if r["reconstruct_events_per_s"] is None:
        return
    print(f"  reconstruct          {r['reconstruct_events_per_s']:>10,} events/s, "
          f"{r['reconstruct_aggregates_per_s']:,} aggregates/s ({r['reconstruct_scope']}: "
          f"{r['reconstructed_aggregates']:,}; version mismatches "
          f"{r['reconstruct_version_mismatches']})")


def _page_sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.reference_log", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=1_000_000, metavar="N",
                   help="events to write through the library, then read (default: %(default)s)")
    p.add_argument("--events-per-aggregate", type=int, default=12, metavar="N",
                   help="events per aggregate (default: %(default)s, like a machine of ours)")
    p.add_argument("--payload-bytes", type=int, default=288, metavar="B",
                   help="compact JSON bytes of each event's data "
                        "(default: %(default)s, our average)")
    p.add_argument("--page-size", type=int, default=PAGE_SIZE, metavar="N",
                   help="rows per select_notifications while reading the log "
                        "(default: %(default)s)")
    p.add_argument("--reconstruct-sample", type=int, default=None, metavar="N",
                   help="reconstruct about N aggregates, evenly spread (default: all)")
    p.add_argument("--compare-page-sizes", type=_page_sizes, default=[], metavar="N,N,...",
                   help="also time a raw log read at each page size, e.g. 10,1000,10000")
    p.add_argument("--reuse", action="store_true",
                   help="read the log an earlier run wrote if it holds at least --events "
                        "events (the write is not timed then)")
    p.add_argument("--no-reconstruct", dest="reconstruct", action="store_false",
                   help="time the log reads only, not the reconstruction of every aggregate")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="write the JSON here instead of bench/results/reference_log.json")
    args = p.parse_args()
    results = measure_reference(
        args.events, events_per_aggregate=args.events_per_aggregate,
        payload_bytes=args.payload_bytes, page_size=args.page_size,
        reconstruct_sample=args.reconstruct_sample, compare_page_sizes=args.compare_page_sizes,
        reuse=args.reuse, reconstruct_too=args.reconstruct)
    print_table(results)
    write_results("reference_log", results, args.json)


if __name__ == "__main__":
    # The library stores each event's topic as "<module>:<class>": run as a script, this
    # module is __main__, and a log naming "__main__:CheckpointHistory.Stepped" would not
    # resolve in any other process. So the domain is used from its importable name.
    from bench.reference_log import main as _main

    _main()
