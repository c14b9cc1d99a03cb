"""The reliability campaign driver: many migrations, worker processes killed at random.

One campaign runs the product as deployed — ``cpctl worker --kubeconfig`` processes on a
PostgreSQL database of its own (``campaign_<random>``, dropped afterwards) — against a
simulated cluster, a node agent per node and a registry, all served from this process.
It keeps ``workloads`` pods, each carrying a unique workload marker, and migrates them
between nodes until ``migrations`` operations have run, while a chaos task SIGKILLs a
random worker at random moments (mid-decision, between commit and action, mid-action)
and restarts it. The ``faults`` profile adds the simulator's API faults (409/429/500,
latency, dropped and expired watches), slow scheduling, nodes failing mid-restore, and a
registry behind a fault proxy (:mod:`tests.reliability.registry_faults`).

At the end it checks the promises from evidence, never from the workers' word
(:func:`check_invariants`): event histories in the database, the simulator's final pod
set and deletion log, the registry's contents and ``cpctl replay --verify``.

With ``upgrade_from`` it starts on the previous release and upgrades to this tree in
its middle (:mod:`tests.reliability.soak_upgrade`; the soak's default).

Used by ``tests/reliability/test_crash_campaign.py`` (CI size) and by ``make soak``
(``python -m tests.reliability.campaign --migrations 5000``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from controlplane.app.operations import submit_operation
from controlplane.clock import SystemClock, new_id
from controlplane.engine.jsonvalue import JsonObject
from controlplane.errors import ControlPlaneError
from controlplane.machines.base.refs import parse_artifact_ref
from controlplane.machines.catalog import default_kinds
from controlplane.machines.submission import Limits
from controlplane.store import codec, migrate
from controlplane.store.database import Database, open_database
from controlplane.worker.composite import CompositeObserver
from drivers.agent import AgentSettings, node_agent
from drivers.agent.pods import PodPatcher
from drivers.agent.sim import Hook, SimDumper
from drivers.kube import KubeDriver, KubeSettings
from drivers.registry import OciLayout, RegistryObserver
from drivers.registry.port import Registry
from drivers.sim import MARKER, SimCluster
from drivers.sim.store import Change

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
PG_ADMIN_URL = os.environ.get("CONTROLPLANE_TEST_PG_ADMIN_URL",
                              "postgresql://postgres@127.0.0.1:5432/postgres")
KUBE = KubeSettings(backoff_initial=0.05, backoff_max=0.5, sync_timeout=20)
#: The milestones each invariant orders (the machines' past-tense event names).
VERIFIED, DELETE_SOURCE = "ArtifactVerified", "SourceDeletionRequested"
RESTORE_VERIFIED, DELETE_ARTIFACT = "RestoreVerified", "ArtifactDeletionRequested"
TAKEOVER = "performing actions left by a previous owner"
#: What a worker logs once it has imported, reached the database and begun to claim.
STARTED = '"event": "worker started"'
FAULTY = ("faults", "soak")  # the profiles whose world injects API and registry faults
EXIT_DB_UNREACHABLE = 3  # cpctl worker's exit code when it cannot reach the database at start


@dataclass(frozen=True)
class CampaignConfig:
    migrations: int = 200
    workers: int = 3
    seed: int = 0
    #: "crash": kills only; "faults": + API/registry/node faults; "soak": faults + one
    #: PostgreSQL restart (main() gives it a throwaway server and the outage)
    profile: str = "crash"
    workloads: int = 24
    nodes: int = 3
    lease_seconds: float = 3.0
    #: seconds each worker works (from its "worker started") before its SIGKILL, uniform
    worker_life: tuple[float, float] = (2.4, 7.5)
    restart_after: tuple[float, float] = (0.0, 0.5)
    kills: bool = True
    limit_seconds: float = 900.0
    pg_admin_url: str = PG_ADMIN_URL
    keep_database: bool = False  # for a post-mortem: print its URL instead of dropping it
    #: a rolling upgrade in the middle (tests/reliability/soak_upgrade.py): "previous" or a
    #: release's version from CHANGELOG.md runs that release's workers and schema first
    upgrade_from: str | None = None
    upgrade_at: float = 0.4  # the share of the migrations finished when it starts
    progress_every: int = 0  # print a progress line each time this many more have ended
    #: stop submitting after this many seconds (then the in-flight ones end and every check
    #: runs as usual): a soak on a loaded machine ends with fewer migrations, not none
    submit_seconds: float | None = None

    def share_reached(self, share: float, ended: int, elapsed: float) -> str | None:
        """Whether ``share`` of the campaign is behind it: "count" when that share of the
        migrations ended, "time" when that share of ``submit_seconds`` went by."""
        if ended >= max(1, int(self.migrations * share)):
            return "count"
        if self.submit_seconds is not None and elapsed >= share * self.submit_seconds:
            return "time"
        return None


@dataclass
class CampaignResult:
    config: CampaignConfig
    db_url: str = ""
    submitted: int = 0
    refused_submissions: int = 0
    kills: int = 0
    restarts: int = 0
    takeovers: int = 0  # a dead owner's committed actions performed by the next owner
    repeated_actions: int = 0  # actions performed again in those takeovers
    action_failures: int = 0  # ActionFailed events (retryable ones are retried)
    outcomes: Counter[str] = field(default_factory=Counter)
    sim_faults: Counter[str] = field(default_factory=Counter)
    registry_faults: Counter[str] = field(default_factory=Counter)
    node_failures: int = 0
    db_outages: int = 0
    db_down_seconds: float = 0.0
    db_exits: int = 0  # workers that started during an outage, exited 3, were restarted
    duration: float = 0.0
    replay_exit: int | None = None
    replay_output: str = ""
    violations: list[str] = field(default_factory=list)
    secret_leaks: list[str] = field(default_factory=list)
    failure_reasons: Counter[str] = field(default_factory=Counter)
    gc_refusals_visible: dict[str, int] = field(default_factory=dict)
    upgrade_lines: list[str] = field(default_factory=list)  # what the upgrade step saw
    submissions_stopped_at: float | None = None  # by submit_seconds, before N were submitted

    def summary(self) -> str:
        c = self.config
        lines = [
            f"campaign profile={c.profile} seed={c.seed} workers={c.workers} "
            f"workloads={c.workloads} nodes={c.nodes}",
            f"  migrations: {sum(self.outcomes.values())} of {c.migrations} "
            f"(submissions refused and retried: {self.refused_submissions})" + (
                f"; submitting stopped at {self.submissions_stopped_at:.0f}s by the time cap"
                if self.submissions_stopped_at is not None else ""),
            f"  kills: {self.kills}  restarts: {self.restarts}  outbox takeovers: "
            f"{self.takeovers}  repeated actions: {self.repeated_actions}  "
            f"ActionFailed events: {self.action_failures}",
            "  outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items())),
        ]
        if self.sim_faults or self.registry_faults or self.node_failures:
            lines.append("  injected: API " + ", ".join(
                f"{k}={v}" for k, v in sorted(self.sim_faults.items())) + "; registry " +
                ", ".join(f"{k}={v}" for k, v in sorted(self.registry_faults.items())) +
                f"; node failures {self.node_failures}")
        if self.failure_reasons:
            lines.append("  failure reasons: " + ", ".join(
                f"{k}={v}" for k, v in self.failure_reasons.most_common(12)))
        if self.db_outages:
            lines.append(f"  database outages: {self.db_outages} "
                         f"({self.db_down_seconds:.1f}s down in all; workers that started "
                         f"into one and exited 3: {self.db_exits})")
        if self.gc_refusals_visible:
            lines.append("  GC refusals visible: " + ", ".join(
                f"{k}={v}" for k, v in sorted(self.gc_refusals_visible.items())))
        lines.extend(f"  {line}" for line in self.upgrade_lines)
        if self.config.profile in FAULTY:
            lines.append(f"  secrets found in logs, events, decisions, pods: "
                         f"{len(self.secret_leaks)}")
        lines.append(f"  replay --verify exit {self.replay_exit}; invariant violations: "
                     f"{len(self.violations)}; duration {self.duration:.1f}s")
        lines.extend(f"  VIOLATION: {v}" for v in self.violations[:30])
        return "\n".join(lines)


@dataclass
class Workload:
    marker: str
    pod: str  # the current pod's name
    node: str
    live: str | None = None  # the migration in flight
    lost: bool = False


# --- the database ---------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def campaign_database(admin_url: str, keep: bool = False) -> AsyncIterator[str]:
    """A fresh PostgreSQL database of this campaign's own, dropped afterwards."""
    name = f"campaign_{new_id()[:12].replace('-', '')}"
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base = admin_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        if keep:
            print(f"campaign database kept: {base}/{name}")
            return  # noqa: B012
        conn = await asyncpg.connect(admin_url, timeout=10)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


# --- worker processes and chaos -------------------------------------------------------------

class Fleet:
    """``cpctl worker --kubeconfig`` processes, one per slot; killed and restarted.

    ``tree`` and ``env`` say which release's code runs (this tree by default; a previous
    release's checkout in a rolling upgrade) and ``prefix`` names its workers apart."""

    def __init__(self, db_url: str, workdir: Path, worker_args: list[str],
                 lease_seconds: float, *, tree: Path = ROOT,
                 env: dict[str, str] | None = None, prefix: str = "") -> None:
        self.db_url, self.workdir, self.args = db_url, workdir, worker_args
        self.lease_seconds = lease_seconds
        self.tree, self.env, self.prefix = tree, env, prefix
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.generation: Counter[int] = Counter()
        self.logs: list[Path] = []
        self.current_log: dict[int, Path] = {}
        #: the schema is ahead of this fleet's code: a worker of it that starts exits 3
        #: (schema not ready), as an old replica restarted mid-upgrade waits in Init
        self.schema_ahead = False
        self.retired = False  # stopped on purpose: its exits are the stopper's to judge

    def start(self, slot: int) -> None:
        self.generation[slot] += 1
        name = f"{self.prefix}w{slot}g{self.generation[slot]}"
        log = self.workdir / f"{name}.log"
        self.logs.append(log)
        self.current_log[slot] = log
        with log.open("wb") as err:
            self.procs[slot] = subprocess.Popen(
                [sys.executable, "-m", "controlplane.cli.main", "--db", self.db_url,
                 "--log-format", "json", "--log-level", "info", "worker", "--worker-id", name,
                 "--lease-seconds", str(self.lease_seconds), "--poll-seconds", "0.05",
                 "--concurrency", "32", *self.args],
                cwd=self.tree, env=self.env, stdout=subprocess.DEVNULL, stderr=err,
                stdin=subprocess.DEVNULL)

    def started(self, slot: int) -> bool:
        """Whether the slot's current worker runs and has logged :data:`STARTED`."""
        proc, log = self.procs.get(slot), self.current_log.get(slot)
        return proc is not None and proc.poll() is None and log is not None and \
            STARTED in log.read_text(errors="replace")

    def kill(self, slot: int) -> bool:
        proc = self.procs.get(slot)
        if proc is None or proc.poll() is not None:
            return False
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True

    def check_alive(self, *, database_may_be_down: bool = False) -> None:
        """Fail on a worker that exited by itself; with ``database_may_be_down``, one that
        exited because it could not reach the database at start is not a failure (the
        campaign restarts it once the database is back, as its Deployment would). Neither
        is one that refused a schema ahead of its code (:attr:`schema_ahead`)."""
        if self.retired:
            return
        for slot, proc in self.procs.items():
            code = proc.poll()
            if (database_may_be_down or self.schema_ahead) and code == EXIT_DB_UNREACHABLE:
                continue
            if code is not None and code != -signal.SIGKILL:
                raise AssertionError(f"worker {slot} exited by itself with {proc.returncode}: "
                                     + self.current_log[slot].read_text()[-2000:])

    def restart_unreachable(self) -> int:
        """Start again every worker that exited because the database was down."""
        if self.schema_ahead or self.retired:
            return 0  # it exited because its code is behind the schema: it stays down
        slots = [slot for slot, proc in self.procs.items()
                 if proc.poll() == EXIT_DB_UNREACHABLE]
        for slot in slots:
            self.start(slot)
        return len(slots)

    def stop(self, timeout: float = 30) -> dict[int, int]:
        """SIGTERM every live worker; each slot's exit code (-9: killed after ``timeout``)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {}
        for slot, proc in self.procs.items():
            try:
                codes[slot] = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[slot] = proc.wait()
        return codes

    def takeovers(self) -> tuple[int, int]:
        """(outbox takeovers, actions performed again in them), from the workers' logs."""
        takeovers = repeated = 0
        for log in self.logs:
            for line in log.read_text(errors="replace").splitlines():
                if TAKEOVER in line:
                    takeovers += 1
                    with contextlib.suppress(ValueError, KeyError):
                        repeated += len(json.loads(line)["actions"])
        return takeovers, repeated


async def chaos(fleets: Fleets, rng: random.Random, cfg: CampaignConfig,
                result: CampaignResult, stop: asyncio.Event,
                database_up: asyncio.Event) -> None:
    """SIGKILL each worker of the current fleet ``cfg.worker_life`` seconds after it
    started working (logged :data:`STARTED`) and start it again, so every life does some
    work however long a start takes: kills on a wall-clock beat (every 0.3-1.2 s) met
    starts of 10 s on a loaded machine, and the fleet only ever started (the CI-size
    campaign passed 420 s). Never while the database is down (a worker that starts
    against a stopped database exits 3, by design), nor while a rolling upgrade swaps the
    fleets (``fleets.lock``)."""
    seeds = [rng.random() for _ in range(cfg.workers)]
    await asyncio.gather(*(_chaos_slot(slot, random.Random(seed), fleets, cfg, result, stop,
                                       database_up) for slot, seed in enumerate(seeds)))


async def _until(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` or until ``stop``; whether it stopped."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()


async def _chaos_slot(slot: int, rng: random.Random, fleets: Fleets, cfg: CampaignConfig,
                      result: CampaignResult, stop: asyncio.Event,
                      database_up: asyncio.Event) -> None:
    while not stop.is_set():
        # A worker that exited by design (database down, schema ahead of its code) starts
        # again elsewhere (restart_unreachable) or not at all (a retired fleet): wait.
        while not fleets.current.started(slot):
            if await _until(stop, 0.05):
                return
        if await _until(stop, rng.uniform(*cfg.worker_life)):
            return
        async with fleets.lock:
            fleet = fleets.current
            if fleet.kill(slot):
                result.kills += 1
            if await _until(stop, rng.uniform(*cfg.restart_after)):
                return
            await database_up.wait()
            fleet.start(slot)
            result.restarts += 1


class Fleets:
    """Every fleet a campaign started, the one the chaos task hits (``current``), and the
    lock a rolling upgrade holds while it stops the old fleet and makes the new current."""

    def __init__(self, first: Fleet) -> None:
        self.current = first
        self.all = [first]
        self.lock = asyncio.Lock()

    def takeovers(self) -> tuple[int, int]:
        pairs = [fleet.takeovers() for fleet in self.all]
        return sum(t for t, _ in pairs), sum(r for _, r in pairs)

    def stop(self) -> None:
        for fleet in self.all:
            fleet.stop()


# --- the campaign ---------------------------------------------------------------------------

Disturber = Callable[["CampaignResult", asyncio.Event], Coroutine[Any, Any, None]]
DB_DOWN = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)


class Poller:
    """The campaign's own reads; survives the database going away (and reconnects)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: asyncpg.Connection | None = None

    async def fetch(self, sql: str, *args: object) -> list[asyncpg.Record] | None:
        """The rows, or ``None`` while the database does not answer."""
        try:
            if self.conn is None or self.conn.is_closed():
                self.conn = await asyncpg.connect(self.url, timeout=5)
            return list(await self.conn.fetch(sql, *args, timeout=30))
        except (*DB_DOWN, TimeoutError):
            if self.conn is not None:
                self.conn.terminate()
            self.conn = None
            return None

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


class Campaign:
    def __init__(self, cfg: CampaignConfig, workdir: Path,
                 disturbers: Sequence[Disturber] = (),
                 database_up: asyncio.Event | None = None) -> None:
        self.cfg, self.workdir = cfg, workdir
        self.disturbers = list(disturbers)
        self.database_up = database_up  # cleared by a disturber while the server is down
        self.rng = random.Random(cfg.seed)
        self.result = CampaignResult(cfg)
        self.deleted_pods: list[tuple[str, str]] = []  # (uid, name) of every pod deleted
        self.specs: dict[str, JsonObject] = {}
        self.failure_messages: list[str] = []
        self.submitted_at: dict[str, float] = {}  # machine id -> time.monotonic()
        self.ended_at: dict[str, tuple[float, str]] = {}  # machine id -> (when, phase)
        self.fleets: Fleets  # set by run()
        self.started = time.monotonic()
        self.progress_printed = 0

    async def run(self) -> CampaignResult:
        started = self.started = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            db_url = await stack.enter_async_context(campaign_database(self.cfg.pg_admin_url,
                                                                     self.cfg.keep_database))
            self.result.db_url = db_url
            db = open_database(db_url, pool_size=5)
            stack.push_async_callback(db.dispose)
            await self.prepare_schema(db, db_url)
            world = await stack.enter_async_context(self.world())
            fleets = self.fleets = Fleets(self.first_fleet(db_url, world))
            stack.callback(fleets.stop)
            for slot in range(self.cfg.workers):
                fleets.current.start(slot)
            stop = asyncio.Event()
            background = [asyncio.create_task(world.disturb(self.rng, stop, self.result)),
                          *(asyncio.create_task(d(self.result, stop)) for d in self.disturbers),
                          *(asyncio.create_task(c) for c in self.steps(db_url, world, stop))]
            if self.cfg.kills:
                up = self.database_up or asyncio.Event()
                if self.database_up is None:
                    up.set()
                background.append(asyncio.create_task(
                    chaos(fleets, random.Random(self.cfg.seed + 1), self.cfg, self.result,
                          stop, up)))
            try:
                async with asyncio.timeout(self.cfg.limit_seconds):
                    await self.drive(db, db_url, world)
            finally:
                stop.set()
                await asyncio.gather(*background)
            async with asyncio.timeout(120):
                await self.settle(db_url)
            fleets.stop()
            world.calm()
            await world.cluster.wait_for(lambda: not any(
                p["metadata"].get("deletionTimestamp") for p in world.cluster.store.peek("pods")),
                limit_seconds=30, what="terminating pods gone")
            self.result.takeovers, self.result.repeated_actions = fleets.takeovers()
            self.result.duration = time.monotonic() - started
            await self.check(db_url, world)
            world.count_faults(self.result)
        return self.result

    def world(self) -> contextlib.AbstractAsyncContextManager[World]:
        return open_world(self.cfg, self.workdir, self.deleted_pods)

    async def prepare_schema(self, db: Database, db_url: str) -> None:
        """This tree's schema (a rolling upgrade starts at the previous release's)."""
        await migrate.upgrade(db)

    def first_fleet(self, db_url: str, world: World) -> Fleet:
        """The workers the campaign starts with: this tree's."""
        return Fleet(db_url, self.workdir, world.worker_args, self.cfg.lease_seconds)

    def steps(self, db_url: str, world: World,
              stop: asyncio.Event) -> list[Coroutine[Any, Any, None]]:
        """Background steps of a subclass's own (the rolling upgrade), beside the chaos."""
        return []

    async def drive(self, db: Database, db_url: str, world: World) -> None:
        cfg = self.cfg
        nodes = world.cluster.node_names
        workloads = []
        for i in range(cfg.workloads):
            name = f"w{i:03d}"
            node = nodes[i % len(nodes)]
            world.cluster.create_pod(NS, name, node=node, marker=f"{name}=seed{cfg.seed}")
            workloads.append(Workload(f"{name}=seed{cfg.seed}", name, node))
        await world.cluster.wait_for(lambda: all(_running(world, w.pod) for w in workloads),
                                     limit_seconds=60, what="workload pods running")
        limits = Limits(max_cluster=cfg.workloads, max_per_source_node=cfg.workloads)
        pg = Poller(db_url)
        try:
            while True:
                self.keep_alive()
                live = [w for w in workloads if w.live]
                if live:
                    rows = await pg.fetch("SELECT id, phase, terminal FROM machines WHERE id = "
                                          "ANY($1::varchar[])", [w.live for w in live])
                    ended = {r["id"]: r["phase"] for r in rows or () if r["terminal"]}
                    for w in live:
                        if w.live in ended:
                            self.result.outcomes[ended[w.live]] += 1
                            self.ended_at[str(w.live)] = (time.monotonic(), ended[w.live])
                            w.live = None
                            self.locate(world, w)
                    self.progress()
                idle = [w for w in workloads if not w.live and not w.lost]
                elapsed = time.monotonic() - self.started
                if (cfg.submit_seconds is not None and elapsed >= cfg.submit_seconds
                        and self.result.submissions_stopped_at is None
                        and self.result.submitted < cfg.migrations):
                    self.result.submissions_stopped_at = elapsed
                enough = (self.result.submitted >= cfg.migrations
                          or self.result.submissions_stopped_at is not None)
                if enough and not live:
                    return
                if not idle and not live:
                    raise AssertionError("every workload was lost")
                for w in idle:
                    if (self.result.submitted >= cfg.migrations
                            or self.result.submissions_stopped_at is not None):
                        break
                    if _running(world, w.pod):
                        await self.submit(db, world, w, limits)
                await asyncio.sleep(0.1)  # polls the database: other processes decide
        finally:
            await pg.close()

    def progress(self) -> None:
        """A line on stdout each ``progress_every`` ended migrations (a long soak's only
        sign of life before its summary)."""
        every, done = self.cfg.progress_every, sum(self.result.outcomes.values())
        if every and done // every > self.progress_printed:
            self.progress_printed = done // every
            r = self.result
            print(f"progress: {done} of {self.cfg.migrations} ended at "
                  f"{time.monotonic() - self.started:.0f}s; kills {r.kills}; " + ", ".join(
                      f"{k}={v}" for k, v in sorted(r.outcomes.items())), flush=True)

    def keep_alive(self) -> None:
        """Fail on a worker that died by itself. With database outages in the campaign, a
        worker started just before one (the chaos task does not restart a worker while the
        database is down, but a worker takes a second to connect) exits 3 by design: it is
        started again once the database is back."""
        outages = self.database_up is not None
        for fleet in self.fleets.all:
            fleet.check_alive(database_may_be_down=outages)
            if outages and self.database_up is not None and self.database_up.is_set():
                revived = fleet.restart_unreachable()
                self.result.restarts += revived
                self.result.db_exits += revived

    def locate(self, world: World, w: Workload) -> None:
        """Follow the workload to wherever its marker now lives."""
        carriers = [p for p in world.cluster.store.peek("pods")
                    if (p["metadata"].get("annotations") or {}).get(MARKER) == w.marker
                    and not p["metadata"].get("deletionTimestamp")]
        if len(carriers) != 1:
            w.lost = True  # reported by check_invariants from the final pod set
            return
        w.pod, w.node = carriers[0]["metadata"]["name"], carriers[0]["spec"].get("nodeName", "")

    async def submit(self, db: Database, world: World, w: Workload, limits: Limits) -> None:
        pod = world.cluster.pod(NS, w.pod)
        assert pod is not None
        others = [n for n in world.ready_nodes() if n != w.node]
        if not others:
            return
        spec: JsonObject = {
            "pod": {"namespace": NS, "name": w.pod, "uid": pod["metadata"]["uid"]},
            "source_node": w.node, "target_node": self.rng.choice(others),
            "template": {"metadata": {"labels": {"workload": w.marker.split("=")[0]}},
                         "spec": {"containers": pod["spec"]["containers"]}},
            "class": {"repository": world.repository_for(self.rng),
                      "timeouts": {"capture": 60, "restore": 60, "schedule": 60, "gc": 30}}}
        try:
            outcome = await submit_operation(db, default_kinds(), world.fresh, kind="migration",
                                             spec=spec, machine_id=new_id(),
                                             now=SystemClock().now(), limits=limits)
        except ControlPlaneError:  # e.g. the API answered 500 while checking: try again
            self.result.refused_submissions += 1
            return
        self.specs[outcome.machine_id] = spec
        self.submitted_at[outcome.machine_id] = time.monotonic()
        w.live = outcome.machine_id
        self.result.submitted += 1

    async def settle(self, db_url: str) -> None:
        """Every machine terminal, its outbox performed and its lease released."""
        fleet = self.fleets.current
        for slot in range(self.cfg.workers):  # chaos is over: every slot has a live worker
            proc = fleet.procs.get(slot)
            if proc is None or proc.poll() is not None:
                fleet.start(slot)
                self.result.restarts += 1
        pg = Poller(db_url)
        try:
            while True:
                rows = await pg.fetch(
                    "SELECT count(*) AS n FROM machines WHERE NOT terminal "
                    "OR lease_owner IS NOT NULL OR next_wake_at IS NOT NULL")
                if rows is not None and rows[0]["n"] == 0:
                    return
                self.keep_alive()
                await asyncio.sleep(0.2)  # polls the database: other processes decide
        finally:
            await pg.close()

    async def check(self, db_url: str, world: World) -> None:
        pg = await asyncpg.connect(db_url, timeout=10)
        try:
            machines = [_decoded(r) for r in await pg.fetch(
                "SELECT id, kind, phase, terminal, state, state_z FROM machines")]
            events = await pg.fetch("SELECT machine_id, seq, type, data FROM events "
                                    "ORDER BY machine_id, seq")
        finally:
            await pg.close()
        histories: dict[str, list[asyncpg.Record]] = {}
        for e in events:
            histories.setdefault(e["machine_id"], []).append(e)
        self.result.action_failures = sum(1 for e in events if e["type"] == "ActionFailed")
        for e in events:
            if e["type"] in ("CaptureFailed", "RestoreFailed", "GarbageCollectionAbandoned"):
                data = _data(e)
                why = str(data.get("reason") or data.get("error_class") or "")
                self.result.failure_reasons[f"{e['type']}:{why[:40]}"] += 1
                self.failure_messages.append(f"{e['type']}: {data.get('message', '')}")
        self.result.violations.extend(await check_invariants(
            machines, histories, world, self.deleted_pods, self.cfg))
        replay = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "controlplane.cli.main", "--db", db_url,
                             "replay", "--verify"], cwd=ROOT, capture_output=True, text=True,
            timeout=300, stdin=subprocess.DEVNULL)
        self.result.replay_exit = replay.returncode
        self.result.replay_output = (replay.stdout + replay.stderr).strip()
        if replay.returncode != 0:
            self.result.violations.append(f"replay --verify exit {replay.returncode}: "
                                          f"{self.result.replay_output[-1000:]}")
        self.result.gc_refusals_visible = await world.gc_refusals(db_url, machines)
        if world.secrets:
            self.result.secret_leaks = await scan_for_secrets(db_url, world, self.workdir)


def _running(world: World, name: str) -> bool:
    pod = world.cluster.pod(NS, name)
    return bool(pod and (pod.get("status") or {}).get("phase") == "Running"
                and not pod["metadata"].get("deletionTimestamp"))


# --- the invariants -------------------------------------------------------------------------

def _decoded(row: asyncpg.Record) -> dict[str, Any]:
    """A machines row with its state decoded, wherever it is stored (``store.codec``)."""
    out = dict(row)
    state = out.pop("state_z", None)
    plain = out["state"]
    out["state"] = codec.decode(state) if state else (
        json.loads(plain) if isinstance(plain, str) else plain)
    return out


def _data(e: asyncpg.Record) -> dict[str, Any]:
    data = e["data"]
    return dict(json.loads(data) if isinstance(data, str) else data)


def history_violations(machine_id: str, kind: str, phase: str, terminal: bool,
                       history: list[tuple[int, str]]) -> list[str]:
    """What one machine's history breaks: (seq, event type) pairs in order."""
    bad: list[str] = []
    types = [t for _, t in history]
    if not terminal:
        bad.append(f"{machine_id} ended in a non-terminal phase {phase}")
    if [seq for seq, _ in history] != list(range(1, len(history) + 1)):
        bad.append(f"{machine_id} has a gap or duplicate in its event sequence")
    if kind != "migration":
        return bad
    # Gate 1: the source is deleted only after its artifact was verified.
    if DELETE_SOURCE in types and (VERIFIED not in types
                                   or types.index(VERIFIED) > types.index(DELETE_SOURCE)):
        bad.append(f"{machine_id}: source deletion requested before ArtifactVerified")
    # Gate 2: the artifact is dropped only after a verified restore.
    if DELETE_ARTIFACT in types and (RESTORE_VERIFIED not in types or types.index(
            RESTORE_VERIFIED) > types.index(DELETE_ARTIFACT)):
        bad.append(f"{machine_id}: artifact deletion requested before RestoreVerified")
    if phase == "Succeeded" and "ArtifactDeleted" not in types:
        bad.append(f"{machine_id}: Succeeded without its artifact collected")
    return bad


async def check_invariants(machines: list[dict[str, Any]],
                           histories: dict[str, list[asyncpg.Record]], world: World,
                           deleted_pods: list[tuple[str, str]],
                           cfg: CampaignConfig) -> list[str]:
    """Every promise, from evidence; returns what did not hold."""
    bad: list[str] = []
    sources: dict[str, list[str]] = defaultdict(list)  # source pod uid -> migration ids
    for m in machines:
        history = histories.get(m["id"], [])
        bad.extend(history_violations(m["id"], m["kind"], m["phase"], m["terminal"],
                                      [(e["seq"], e["type"]) for e in history]))
        if m["kind"] != "migration":
            continue
        types = [e["type"] for e in history]
        spec = _data(history[0])["spec"]
        sources[spec["pod"]["uid"]].append(m["id"])
        # The registry: a verified artifact is gone only if this history dropped it.
        pinned = [_data(e)["pinned"] for e in history if e["type"] == VERIFIED]
        for ref in pinned:
            present = await world.artifact_present(ref)
            if present is None:
                continue  # the registry did not answer: no evidence either way
            if not present and DELETE_ARTIFACT not in types:
                bad.append(f"{m['id']}: artifact {ref} is gone but was never collected")
            if present and "ArtifactDeleted" in types:
                bad.append(f"{m['id']}: artifact {ref} recorded deleted but still present")
    # The simulator's deletion log: a source pod was deleted only by its migration, and
    # only after that migration verified its artifact.
    for uid, name in deleted_pods:
        if uid not in sources:
            continue  # a restore attempt's pod (cleaned up by its own history) or the like
        # A pod may be the source of several migrations (a failed one, then another):
        # one of them must have verified its artifact and asked for the deletion.
        if not any(VERIFIED in ts and DELETE_SOURCE in ts for ts in (
                [e["type"] for e in histories.get(mid, [])] for mid in sources[uid])):
            bad.append(f"source pod {name} ({uid}) was deleted but none of its migrations "
                       f"{sources[uid]} verified an artifact and asked for the deletion")
    # The final pod set: each workload exactly once, Running, with its marker.
    carriers: Counter[str] = Counter()
    where: dict[str, list[str]] = {}
    where = defaultdict(list)
    for pod in world.cluster.store.peek("pods"):
        marker = (pod["metadata"].get("annotations") or {}).get(MARKER)
        if marker is None:
            bad.append(f"pod {pod['metadata']['name']} carries no workload marker: "
                       f"{pod['spec'].get('nodeName')} {(pod.get('status') or {}).get('phase')} "
                       f"{sorted((pod['metadata'].get('annotations') or {}).items())}")
            continue
        carriers[marker] += 1
        where[marker].append(f"{pod['metadata']['name']}@{pod['spec'].get('nodeName')}:"
                             f"{(pod.get('status') or {}).get('phase')}")
        if (pod.get("status") or {}).get("phase") != "Running":
            bad.append(f"pod {pod['metadata']['name']} ({marker}) is "
                       f"{(pod.get('status') or {}).get('phase')}")
    for i in range(cfg.workloads):
        marker = f"w{i:03d}=seed{cfg.seed}"
        if carriers[marker] != 1:
            bad.append(f"workload {marker} is carried by {carriers[marker]} pods, not 1: "
                       f"{where[marker]}")
    return bad


# --- secrets ---------------------------------------------------------------------------------

API_TOKEN = "api-token-campaign-91be04d2"


async def scan_for_secrets(db_url: str, world: World, workdir: Path) -> list[str]:
    """Serve the API with a token over the campaign's database and use it (as operators
    and the dashboard do); then search every log line, event, decision, machine row,
    Kubernetes Event and pod annotation for the token and the registry credentials."""
    from aiohttp.test_utils import TestClient, TestServer

    from controlplane.api.app import make_app
    from controlplane.api.serving import RedactingAccessLogger

    captured: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(self.format(record))

    handler = Capture(level=logging.DEBUG)
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    db = open_database(db_url, pool_size=2)
    try:
        server = TestServer(make_app(db, token=API_TOKEN))
        await server.start_server(access_log_class=RedactingAccessLogger)
        async with TestClient(server) as client:
            auth = {"Authorization": f"Bearer {API_TOKEN}"}
            await client.get(f"/?token={API_TOKEN}")
            listed = await (await client.get("/api/v1/operations?limit=5",
                                             headers=auth)).json()
            for op in listed["operations"][:2]:
                await client.get(f"/api/v1/operations/{op['id']}/events", headers=auth)
                await client.post(f"/api/v1/operations/{op['id']}/cancel", headers=auth)
            await client.get("/metrics", headers=auth)
            await client.get("/api/v1/operations", headers={"Authorization": "Bearer no"})
    finally:
        await db.dispose()
        root.removeHandler(handler)
        root.setLevel(previous)
    pg = await asyncpg.connect(db_url, timeout=10)
    try:
        rows = [*await pg.fetch("SELECT machine_id AS id, data::text AS a, facts::text AS b, "
                                "facts_z AS c, input_z AS d FROM events"),
                *await pg.fetch("SELECT machine_id AS id, input::text AS a, cause AS b, "
                                "NULL::bytea AS c, NULL::bytea AS d FROM decisions"),
                *await pg.fetch("SELECT id, spec::text AS a, state::text AS b, state_z AS c, "
                                "NULL::bytea AS d FROM machines")]
    finally:
        await pg.close()
    places: list[tuple[str, str]] = [("api log", line) for line in captured]
    places += await asyncio.to_thread(_worker_logs, workdir)
    # The compressed columns (store.codec) are scanned as what they hold, not as bytes.
    places += [(f"row of {r['id']}", " ".join(
        [str(r["a"]), str(r["b"]), *(json.dumps(codec.decode(r[z])) for z in "cd" if r[z])]))
        for r in rows]
    places += [(f"{plural} object", json.dumps(o)) for plural in ("events", "pods")
               for o in world.cluster.store.peek(plural)]
    leaks = []
    for secret in (*world.secrets, API_TOKEN):
        leaks += [f"{where} holds {secret[:6]}..." for where, text in places if secret in text]
    return leaks


def _worker_logs(workdir: Path) -> list[tuple[str, str]]:
    return [(f"worker log {p.name}", p.read_text(errors="replace"))
            for p in sorted(workdir.glob("*w*g*.log"))]  # a previous release's too


# --- the world: cluster, agents, registry ---------------------------------------------------

class World:
    """The simulated cluster, its agents and the registry, as this campaign's profile says."""

    def __init__(self, cluster: SimCluster, kube: KubeDriver, registry: Registry,
                 repository: str, worker_args: list[str]) -> None:
        self.cluster, self.kube, self.registry = cluster, kube, registry
        self.repository = repository
        self.worker_args = worker_args
        self.fresh = CompositeObserver(cluster=kube.fresh_observer,
                                       registry=RegistryObserver(registry))
        self.failed_nodes: set[str] = set()

    secrets: tuple[str, ...] = ()  # strings that must never be logged or recorded

    def ready_nodes(self) -> list[str]:
        return [n for n in self.cluster.node_names if n not in self.failed_nodes]

    def repository_for(self, rng: random.Random) -> str:
        return self.repository

    async def disturb(self, rng: random.Random, stop: asyncio.Event,
                      result: CampaignResult) -> None:
        """The crash profile disturbs nothing but the workers."""

    def calm(self) -> None:
        """End every injected fault before the evidence is read."""

    def count_faults(self, result: CampaignResult) -> None:
        result.sim_faults.update(self.cluster.faults.injected)

    async def artifact_present(self, ref: str) -> bool | None:
        parsed = parse_artifact_ref(ref, field="artifact")
        reference = parsed.digest or parsed.tag
        assert reference is not None
        try:
            return await self.registry.resolve(parsed.repo, reference) is not None
        except Exception:  # the registry's own error types: no evidence
            return None

    async def gc_refusals(self, db_url: str, machines: list[dict[str, Any]]) -> dict[str, int]:
        return {}


@contextlib.asynccontextmanager
async def open_world(cfg: CampaignConfig, workdir: Path, deleted: list[tuple[str, str]],
                     *, before_dump: Hook | None = None) -> AsyncIterator[World]:
    """``before_dump``: awaited by every node's agent before it dumps (a test holds a
    capture with it; the simulator profile only)."""
    if cfg.profile in FAULTY:
        assert before_dump is None, "before_dump holds the simulator profile's agents"
        from tests.reliability.fault_world import open_fault_world

        async with open_fault_world(cfg, workdir, deleted) as world:
            yield world
        return
    async with SimCluster(nodes=cfg.nodes, seed=cfg.seed) as cluster:
        kubeconfig = cluster.write_kubeconfig(workdir / "sim.kubeconfig")
        layout = workdir / "oci"
        registry = OciLayout(layout)
        unsubscribe = cluster.store.subscribe(lambda c: record_deletion(c, deleted))
        kube = await KubeDriver.connect(kubeconfig=str(kubeconfig), settings=KUBE)
        try:
            async with kube, agents(cluster, kube, registry, workdir, before_dump):
                limits = str(cfg.workloads)
                yield World(cluster, kube, registry, "localhost:5000/checkpoints/campaign",
                            ["--kubeconfig", str(kubeconfig), "--registry-layout", str(layout),
                             "--max-operations", limits, "--max-per-node", limits])
        finally:
            unsubscribe()


def record_deletion(change: Change, into: list[tuple[str, str]]) -> None:
    if change.resource == "pods" and change.type == "DELETED":
        meta = change.obj.get("metadata") or {}
        into.append((str(meta.get("uid")), str(meta.get("name"))))


@contextlib.asynccontextmanager
async def agents(cluster: SimCluster, kube: KubeDriver, registry: Registry,
                 workdir: Path, before_dump: Hook | None = None) -> AsyncIterator[None]:
    def dumper(patcher: PodPatcher) -> SimDumper:
        return SimDumper(patcher, before_dump=before_dump)
    async with contextlib.AsyncExitStack() as stack:
        for node in cluster.node_names:
            await stack.enter_async_context(node_agent(
                client=kube.client, registry=registry, dumper=dumper, kube=KUBE,
                settings=AgentSettings(node, workdir / "agents" / node, capture_timeout=60,
                                       restore_timeout=60, parallel=8)))
        yield


# --- command line (make soak) ---------------------------------------------------------------

def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.reliability.campaign", description=__doc__.split("\n\n")[0],
        epilog="The soak profile (make soak) runs the fault world with worker kills on a "
               "throwaway PostgreSQL server of its own, stopped once for --outage-seconds "
               "when half the migrations have finished, and a rolling upgrade from the "
               "previous release (--upgrade-from) when --upgrade-at of them have.")
    p.add_argument("--migrations", type=int, default=5000)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", choices=["crash", "faults", "soak"], default="crash")
    p.add_argument("--workloads", type=int, default=24,
                   help="pods kept migrating at once (default 24)")
    p.add_argument("--no-kills", action="store_true")
    p.add_argument("--outage-seconds", type=float, default=5.0,
                   help="soak profile: how long the database stays down (default 5)")
    p.add_argument("--workdir", type=Path, default=ROOT / "var" / "soak")
    p.add_argument("--limit-seconds", type=float, default=6 * 3600)
    p.add_argument("--upgrade-from", metavar="previous|VERSION|none", default=None,
                   help="start on that release of CHANGELOG.md (its workers, its schema) and "
                        "upgrade to this tree in the middle, as docs/install.md's procedure "
                        "does (default: previous for the soak profile, none otherwise)")
    p.add_argument("--upgrade-at", type=float, default=0.4,
                   help="the share of the migrations finished when the upgrade starts "
                        "(default 0.4)")
    p.add_argument("--submit-seconds", type=float, default=None, metavar="S",
                   help="stop submitting after S seconds, let the rest end and check as "
                        "usual; the upgrade and the outage then come at their share of S "
                        "if the migrations' count has not brought them earlier")
    p.add_argument("--progress-every", type=int, default=250, metavar="N",
                   help="print a progress line each N ended migrations (0: none)")
    args = p.parse_args()
    upgrade_from = args.upgrade_from or ("previous" if args.profile == "soak" else "none")
    cfg = CampaignConfig(migrations=args.migrations, workers=args.workers, seed=args.seed,
                         profile=args.profile, workloads=args.workloads,
                         kills=not args.no_kills, limit_seconds=args.limit_seconds,
                         upgrade_from=None if upgrade_from == "none" else upgrade_from,
                         upgrade_at=args.upgrade_at, progress_every=args.progress_every,
                         submit_seconds=args.submit_seconds)
    from controlplane import logs

    logs.configure("console", "warning")  # this process: the agents and the simulator
    if args.workdir.exists():
        shutil.rmtree(args.workdir)  # a previous run's logs would count as this one's
    args.workdir.mkdir(parents=True)
    if cfg.profile == "soak":
        result = asyncio.run(_soak(cfg, args.workdir, args.outage_seconds))
    else:
        result = asyncio.run(campaign_class(cfg)(cfg, args.workdir).run())
    print(result.summary(), flush=True)
    return 0 if not result.violations else 1


async def _soak(cfg: CampaignConfig, workdir: Path, outage_seconds: float) -> CampaignResult:
    """The fault campaign with kills on a throwaway server, restarted once half-way."""
    from dataclasses import replace

    from tests.reliability.outages import outages
    from tests.reliability.throwaway_pg import throwaway_postgres

    with throwaway_postgres() as server:
        up = asyncio.Event()
        up.set()
        outage = outages(server, after=(0,), down_seconds=outage_seconds, database_up=up)
        started = time.monotonic()

        async def half_way(result: CampaignResult, stop: asyncio.Event) -> None:
            """The outage once half the migrations ended (or half the time cap went by)."""
            while not cfg.share_reached(0.5, sum(result.outcomes.values()),
                                        time.monotonic() - started) and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.1):
                        await stop.wait()  # polls the campaign's progress
            await outage(result, stop)

        return await campaign_class(cfg)(replace(cfg, pg_admin_url=server.admin_url), workdir,
                                         disturbers=[half_way], database_up=up).run()


def campaign_class(cfg: CampaignConfig) -> type[Campaign]:
    """The campaign, or with ``upgrade_from`` the one with a rolling upgrade in it."""
    if cfg.upgrade_from is None:
        return Campaign
    from tests.reliability.soak_upgrade import UpgradingCampaign

    return UpgradingCampaign


if __name__ == "__main__":
    raise SystemExit(main())
