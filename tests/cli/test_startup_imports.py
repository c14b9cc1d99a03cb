"""``cpctl`` starts fast because parsing imports no verb: ``cpctl --help``,
every verb's ``--help`` and a command line the parser refuses load none of the store,
machine, driver, HTTP or YAML stacks, and ``cpctl list`` loads the store's reads but not
the machines, the worker, Alembic or the drivers. Each command runs in a fresh
interpreter that then reports the modules it imported: these tests pin modules, never
times (``python -m bench.cli_startup`` times them)."""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.cli.main import Lazy, build_parser

ROOT = Path(__file__).resolve().parents[2]

#: What no ``--help`` may import: each is tens of milliseconds or more, and the parser
#: needs none of them (asyncio included: the event loop starts after parsing).
NOT_FOR_HELP = (
    "sqlalchemy", "alembic", "asyncpg", "aiosqlite", "aiohttp", "kubernetes_asyncio",
    "yaml", "cryptography", "zstandard", "orjson", "structlog", "tenacity", "asyncio",
    "controlplane.store", "controlplane.machines", "controlplane.app", "controlplane.worker",
    "controlplane.wiring", "controlplane.api", "controlplane.frontdoor", "drivers",
)
#: What ``cpctl list`` may not import: it reads rows through the store's queries.
NOT_FOR_LIST = (
    "alembic", "asyncpg", "aiohttp", "kubernetes_asyncio", "yaml", "cryptography",
    "structlog",  # logging is configured, but nothing logs: structlog comes with a logger
    "controlplane.machines", "controlplane.worker", "controlplane.wiring", "controlplane.api",
    "controlplane.frontdoor", "drivers",
)

#: Runs each command line of the JSON list argv[2] in this one interpreter, then writes
#: their exit codes and every module imported to the file argv[1].
PROBE = """\
import json, sys
from controlplane.cli.main import main
codes = []
for args in json.loads(sys.argv[2]):
    try:
        codes.append(main(args))
    except SystemExit as exc:
        codes.append(exc.code)
with open(sys.argv[1], "w") as out:
    json.dump({"codes": codes, "modules": sorted(sys.modules)}, out)
"""


def imported(tmp_path: Path, *argvs: list[str]) -> tuple[list[int], set[str]]:
    """The exit codes of ``cpctl ARGS`` for each of ``argvs``, run one after the other in
    a fresh interpreter, and every module that interpreter imported."""
    report = tmp_path / "imported.json"
    done = subprocess.run([sys.executable, "-c", PROBE, str(report), json.dumps(argvs)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert report.exists(), done.stderr
    found = json.loads(report.read_text())
    return found["codes"], set(found["modules"])


def loaded(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    """The packages of ``packages`` that are imported (a package or any module in it)."""
    return [p for p in packages if any(m == p or m.startswith(p + ".") for m in modules)]


def verbs(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
          ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every verb of the parser that runs something (nested ones too), with its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                has_verbs = any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
                if has_verbs:
                    yield from verbs(sub, (*prefix, name))
                else:
                    yield (*prefix, name), sub


def help_argvs() -> list[list[str]]:
    """``VERB --help`` of every verb, as a user types it (``history prune``, not the
    ``history-prune`` the parser routes it to)."""
    argvs = []
    for names, _ in verbs(build_parser()):
        *head, last = names
        argvs.append([*head, *last.split("-", 1), "--help"] if last.startswith("history-")
                     else [*names, "--help"])
    return argvs


@pytest.mark.parametrize(("args", "code"), [
    (["--help"], 0),
    (["migrate", "--help"], 0),
    ([], 2),
    (["no-such-verb"], 2),
    (["list", "--limit", "0"], 2),
])
def test_parsing_and_help_import_no_store_driver_or_http_stack(
    tmp_path: Path, args: list[str], code: int,
) -> None:
    codes, modules = imported(tmp_path, args)
    assert codes == [code]
    assert loaded(modules, NOT_FOR_HELP) == [], f"cpctl {' '.join(args)}"


def test_no_verbs_help_imports_a_heavy_module(tmp_path: Path) -> None:
    """Every verb's ``--help`` in one interpreter: what any of them imports stays."""
    argvs = help_argvs()
    codes, modules = imported(tmp_path, *argvs)
    assert codes == [0] * len(argvs)
    assert loaded(modules, NOT_FOR_HELP) == []


def test_list_reads_the_store_without_the_machines_worker_alembic_or_drivers(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'controlplane.db'}"
    upgraded = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "--db", db,
                               "db", "upgrade"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)
    assert upgraded.returncode == 0, upgraded.stderr
    codes, modules = imported(tmp_path, ["--db", db, "list"])
    assert codes == [0]
    assert "controlplane.store.queries" in modules  # it did read the store
    assert loaded(modules, NOT_FOR_LIST) == []


def test_every_verb_names_a_handler_that_exists() -> None:
    """The table of ``module:function`` names is checked here, as an import would be."""
    for names, parser in verbs(build_parser()):
        handler = parser.get_default("handler")
        if isinstance(handler, Lazy):
            handler = handler.resolve()
        assert inspect.iscoroutinefunction(handler), " ".join(names)
