"""Shared pieces of the benchmarks: a fresh PostgreSQL database, the bare commit-rate
floor measured in the same run, peak-RSS sampling, database footprint, JSON output.

Every scenario (``bench.engine_throughput``, ``bench.scale``, ``bench.growth``,
``bench.recovery``, ``bench.replay``, ``bench.kube_api``) prints a human table, then one
JSON line, and writes the same JSON to ``bench/results/<scenario>.json`` (or ``--json
FILE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import text

from controlplane.store import queries
from controlplane.store.database import Database

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
#: The tables a machine's history and projection live in (footprint per operation), and
#: the one summary row a pruned operation keeps.
TABLES = ("events", "decisions", "machines", "machine_keys", "operation_summaries")


def db_name(scenario: str) -> str:
    """``cp_bench_<scenario>``; ``$BENCH_DB_PREFIX`` replaces ``cp_bench`` (the smoke tests
    use their own, so they never drop a database a benchmark run is using)."""
    return f"{os.environ.get('BENCH_DB_PREFIX', 'cp_bench')}_{scenario}"


async def fresh_database(name: str) -> str:
    """Drop and create ``name`` on the local server (benchmarks never touch ``test``)."""
    conn = await asyncpg.connect(ADMIN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return f"postgresql://postgres@127.0.0.1:5432/{name}"


async def drop_database(name: str) -> None:
    conn = await asyncpg.connect(ADMIN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def floor(db: Database, total: int, concurrency: int) -> float:
    """Single-row INSERT + COMMIT per second, ~200 B JSON, through the same engine."""
    async with db.writer.begin() as conn:
        await conn.execute(text("DROP TABLE IF EXISTS bench_floor"))
        await conn.execute(text("CREATE TABLE bench_floor (id bigserial PRIMARY KEY, "
                                "payload jsonb NOT NULL)"))
    payload = json.dumps({"payload": "x" * 200})
    per_task = total // concurrency

    async def loop() -> None:
        for _ in range(per_task):
            async with db.writer.begin() as conn:
                await conn.execute(text("INSERT INTO bench_floor (payload) VALUES "
                                        "(CAST(:p AS jsonb))"), {"p": payload})

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    rate = per_task * concurrency / (time.perf_counter() - started)
    async with db.writer.begin() as conn:
        await conn.execute(text("DROP TABLE bench_floor"))
    return rate


async def floors(db: Database, *, quick: bool = False) -> dict[str, float]:
    """The bare commit floor at concurrency 1 and 32 (``quick``: a quarter of the commits;
    ``$BENCH_FLOOR_COMMITS`` sets the count at concurrency 1, e.g. tiny for smoke tests)."""
    c1 = int(os.environ.get("BENCH_FLOOR_COMMITS", "0")) or (500 if quick else 2000)
    return {"floor_c1_per_s": await floor(db, c1, 1),
            "floor_c32_per_s": await floor(db, max(32, 4 * c1), 32)}


async def until_all_terminal(db: Database, every: float = 0.1) -> None:
    """Poll the database (the workers may be other processes: nothing to await)."""
    flt = queries.MachineFilter(settled=False, limit=1)
    while await queries.list_machines(db, flt):  # noqa: ASYNC110
        await asyncio.sleep(every)


async def footprint(db: Database) -> dict[str, dict[str, int]]:
    """Rows and on-disk bytes (heap + indexes + TOAST) of each engine table."""
    out: dict[str, dict[str, int]] = {}
    async with db.reader.connect() as conn:
        for table in TABLES:
            rows = await conn.scalar(text(f"SELECT count(*) FROM {table}"))
            # A partitioned table's own size is 0: its partitions' sizes are summed.
            size = await conn.scalar(text(
                "SELECT CASE WHEN c.relkind = 'p' THEN (SELECT coalesce(sum("
                "pg_total_relation_size(t.relid)), 0) FROM pg_partition_tree(c.oid) t) "
                "ELSE pg_total_relation_size(c.oid) END "
                f"FROM pg_class c WHERE c.oid = to_regclass('{table}')"))
            out[table] = {"rows": int(rows or 0), "bytes": int(size or 0)}
    return out


async def live_footprint(db: Database) -> dict[str, dict[str, int]]:
    """:func:`footprint` after ``VACUUM FULL`` of those tables: the bytes the live rows
    take, without the dead row versions every commit leaves until autovacuum reuses
    their space (what history costs to keep, as opposed to what a burst left behind)."""
    async with db.writer.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in TABLES:
            await conn.execute(text(f"VACUUM FULL {table}"))
    return await footprint(db)


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size now, from /proc (this process by default)."""
    where = f"/proc/{pid or os.getpid()}/status"
    with open(where) as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU a live process has used, from /proc (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds() -> float:
    """CPU of every live PostgreSQL process (backends, writers), summed.

    A backend's CPU leaves the sum when it exits, so compare two readings taken while
    the same pooled connections are open (or use :class:`PostgresCpuSampler`).
    """
    return sum(cpu_seconds(pid) for pid in _postgres_pids())


def _postgres_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as comm:
                    if comm.read().startswith("postgres"):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


class PostgresCpuSampler:
    """PostgreSQL's CPU over a run, backends that exit during it included.

    :func:`postgres_cpu_seconds` loses a backend's CPU when it exits (a parallel
    rebuild's children close their connections before the run ends), so this samples
    every backend every ``every`` seconds and keeps each one's last reading; a backend
    first seen mid-run counts from zero. What exits between two samples is lost (at most
    ``every`` seconds of it).
    """

    def __init__(self, every: float = 0.2) -> None:
        self.every = every
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None

    def _sample(self, *, baseline: bool = False) -> None:
        for pid in _postgres_pids():
            used = cpu_seconds(pid)
            if used:
                self._last[pid] = used
                if baseline:
                    self._first[pid] = used

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            self._sample()

    def start(self) -> None:
        self._sample(baseline=True)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> float:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sample()
        return round(sum(used - self._first.get(pid, 0.0)
                         for pid, used in self._last.items()), 1)


def own_cpu_seconds() -> float:
    """CPU of this process and of its children that have exited (a process pool's)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


class CpuMeter:
    """CPU seconds of named processes between :meth:`start` and :meth:`stop`.

    Wall time moves with whatever else the machine runs; CPU per process says which
    part of a run is busy (the control plane, the simulator, the agents, PostgreSQL).
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._start: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        now = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        now["postgres"] = postgres_cpu_seconds()
        return now

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> dict[str, float]:
        end = self._read()
        self.used = {k: round(end[k] - self._start.get(k, 0.0), 1) for k in end}
        return self.used


def peak_rss_bytes() -> int:
    """This process's high-water RSS (the kernel's, so no sample can miss it)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RssSampler:
    """Samples this process's RSS every ``every`` seconds while running (a timeline)."""

    def __init__(self, every: float = 0.5) -> None:
        self.every = every
        self.samples: list[tuple[float, int]] = []
        self._task: asyncio.Task[None] | None = None
        self._started = time.perf_counter()

    async def _run(self) -> None:
        while True:
            self.samples.append((time.perf_counter() - self._started, rss_bytes()))
            await asyncio.sleep(self.every)

    def start(self) -> None:
        self._started = time.perf_counter()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def peak(self) -> int:
        return max((b for _, b in self.samples), default=rss_bytes())


def write_results(scenario: str, results: dict[str, Any], path: Path | None = None) -> Path:
    """Print the figures as one JSON line and write them to ``bench/results/``."""
    target = path or RESULTS / f"{scenario}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    results = {"scenario": scenario, "argv": sys.argv[1:], **results}
    target.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(results, sort_keys=True), flush=True)
    return target


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"
