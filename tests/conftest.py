"""Shared fixtures: a fresh, migrated database on each backend, and a fake clock.

Storage tests take the ``db`` fixture and so run twice: on a SQLite file and on the
local PostgreSQL (``$CONTROLPLANE_TEST_PG_URL``, default the machine's server). A missing
PostgreSQL FAILS the run: it is never skipped.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import tracemalloc
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from controlplane.clock import FakeClock
from controlplane.store import migrate
from controlplane.store.database import Database, open_database
from tests.support.envtest import HOW_TO_ENABLE, RealCluster, open_real_cluster

PG_ADMIN_URL = os.environ.get("CONTROLPLANE_TEST_PG_ADMIN_URL",
                              "postgresql://postgres@127.0.0.1:5432/postgres")
PG_TEST_DB = os.environ.get("CONTROLPLANE_TEST_PG_DB", f"cp_test_{os.getpid()}")
PG_TEST_URL = f"postgresql://postgres@127.0.0.1:5432/{PG_TEST_DB}"


async def _pg_admin(sql: str) -> None:
    try:
        conn = await asyncpg.connect(PG_ADMIN_URL.replace("postgresql+asyncpg", "postgresql"),
                                     timeout=10)
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.fail(f"PostgreSQL is required for the storage tests and is not reachable at "
                    f"{PG_ADMIN_URL}: {exc}. Start it: pg_ctlcluster --skip-systemctl-redirect "
                    "$(ls /etc/postgresql) main start", pytrace=False)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A PostgreSQL database of this test session's own, dropped at the end."""
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{PG_TEST_DB}" WITH (FORCE)'))
    asyncio.run(_pg_admin(f'CREATE DATABASE "{PG_TEST_DB}"'))
    yield PG_TEST_URL
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{PG_TEST_DB}" WITH (FORCE)'))


async def _reset_pg(url: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An EMPTY database URL on each backend (no schema)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'controlplane.db'}"
    url: str = request.getfixturevalue("pg_database")
    asyncio.run(_reset_pg(url))
    return url


@pytest.fixture(scope="session")
def migrated_templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigratedTemplates]:
    """Per test process, an empty database at the schema's head on each backend, made by
    the migrations once: the ``db`` fixture copies it (a file copy; PostgreSQL's
    ``CREATE DATABASE ... TEMPLATE``, 0.05 s against the migrations' 0.8 s). The
    migrations themselves are tested from an empty database in ``tests/store``."""
    templates = MigratedTemplates(tmp_path_factory.mktemp("migrated"))
    yield templates
    if "postgresql" in templates.made:
        asyncio.run(_pg_admin(
            f'DROP DATABASE IF EXISTS "{templates.made["postgresql"]}" WITH (FORCE)'))


@dataclass
class MigratedTemplates:
    folder: Path
    made: dict[str, str] = field(default_factory=dict)  # backend -> file or database name


async def _migrated_copy(db_url: str, templates: MigratedTemplates) -> None:
    """``db_url``'s database as a copy of the migrated template (made on first use)."""
    backend = "sqlite" if db_url.startswith("sqlite") else "postgresql"
    made = templates.made
    if backend not in made:
        if backend == "sqlite":
            template = str(templates.folder / "migrated.db")
            url = f"sqlite:///{template}"
        else:
            template = f"{PG_TEST_DB}_migrated"
            await _pg_admin(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
            await _pg_admin(f'CREATE DATABASE "{template}"')
            url = PG_TEST_URL.rsplit("/", 1)[0] + f"/{template}"
        database = open_database(url)
        try:
            await migrate.upgrade(database)
        finally:
            await database.dispose()
        made[backend] = template
    if backend == "sqlite":
        await asyncio.to_thread(shutil.copyfile, made[backend],
                                db_url.removeprefix("sqlite:///"))
    else:
        await _pg_admin(f'DROP DATABASE IF EXISTS "{PG_TEST_DB}" WITH (FORCE)')
        await _pg_admin(f'CREATE DATABASE "{PG_TEST_DB}" TEMPLATE "{made[backend]}"')


@pytest.fixture
async def db(db_url: str, migrated_templates: MigratedTemplates) -> AsyncIterator[Database]:
    """A migrated database on each backend (a copy of one the migrations made)."""
    await _migrated_copy(db_url, migrated_templates)
    database = open_database(db_url, pool_size=40)
    yield database
    await database.dispose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def _collect_what_the_test_left() -> Iterator[None]:
    """A socket, transport or subprocess a test leaves open fails THAT test, at its own
    teardown: the garbage is collected here, after the test's fixtures are closed, so
    the ``ResourceWarning`` (an error under ``filterwarnings = error``) lands where the
    object was made, not in whichever later test the collector happens to run in.
    ``CONTROLPLANE_TEST_TRACEMALLOC=20`` makes the report say where the leaked object was
    made (tracing starts after collection, so it costs little)."""
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _logging_as_the_test_found_it() -> Iterator[None]:
    """A test that runs ``cpctl`` in-process configures structlog for the whole worker
    process (``--log-level error`` filters warnings out): put structlog back to its
    defaults after each test, so a later test's ``capture_logs`` sees every line."""
    yield
    import sys

    if "structlog" in sys.modules:
        import structlog

        from controlplane import logs

        structlog.reset_defaults()
        logs.reset()


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """The real Kubernetes API server of this session (envtest), or the one named by
    ``CONTROLPLANE_TEST_KUBECONFIG``; skipped with one line saying how to enable it.

    With envtest: etcd + kube-apiserver v1.36 (AlwaysAllow) and the kubelet role
    (``cpctl sim nodes``) keeping nodes ``node-1..3`` Ready, scheduling through
    ``pods/binding`` and finishing deletions. Started once, stopped by PID at the end."""
    with open_real_cluster(tmp_path_factory.mktemp("envtest")) as cluster:
        yield cluster


#: Seconds a ``slow`` test without a timeout of its own may run before pytest-timeout
#: calls it hung (others: pyproject's 120). Such tests start many interpreters and
#: servers: on a machine half as fast and fully loaded, a 60 s scenario took 122 s.
SLOW_TIMEOUT = 300


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that hold a ``slow`` test run first, each file's tests kept together and
    in order: under ``make test``'s workers (``--dist loadfile --no-loadscope-reorder``)
    the long worlds (real controllers, envtest, CRIU, the campaigns) start at once and the
    many short files fill the gaps, instead of one long file starting last and running
    alone at the end. A ``slow`` test without a timeout of its own gets
    :data:`SLOW_TIMEOUT`."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
    for item in items:  # a hang guard, not a budget: a loaded machine is no hang
        if item.get_closest_marker("slow") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything imported so far (modules, classes, the collected tests) lives for the
    whole session: frozen, it is not traversed again by the per-test collection below,
    which then costs what the test itself allocated."""
    gc.collect()
    gc.freeze()
    frames = int(os.environ.get("CONTROLPLANE_TEST_TRACEMALLOC", "0"))
    if frames:  # where a leaked object was made, traced from here on (imports untraced)
        tracemalloc.start(frames)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """Every skip for want of a real API server is reported at one place, so ``-ra``
    prints ONE line (with the count) saying how to enable the real half, not one per test."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and isinstance(report.longrepr, tuple) and \
            HOW_TO_ENABLE in str(report.longrepr[2]):
        report.longrepr = (__file__, 0, f"Skipped: {HOW_TO_ENABLE}")
