"""How long ``cpctl`` takes to start, as a user waits for it: whole processes, the
interpreter's own start included.

``python -m bench.cli_startup [--runs N] [--json FILE]`` times, N times each (default 7),
one after another: ``python -c pass`` (the floor no command can beat), ``cpctl --help``,
``cpctl VERB --help`` for every verb the parser has (nested ones too: ``db upgrade``,
``history prune``...), and ``cpctl list`` on a fresh migrated SQLite database. Prints
the median and the fastest of each, and its median CPU seconds, beside the targets
(help 0.25 s, list 0.5 s, on the median wall time), then the modules whose import costs
most in ``cpctl --help`` and ``cpctl list`` (``python -X importtime``: the entry point's
import statements by cumulative time, and packages by their own time), then one JSON
line; writes ``bench/results/cli_startup.json``. The machine's other load moves the wall
times (the CPU times much less; the load average is recorded): compare figures taken on
the same machine, at the same time.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import write_results

#: The start-up targets, in seconds, for the median of a command.
HELP_TARGET_S = 0.25
LIST_TARGET_S = 0.5
_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def cpctl() -> list[str]:
    """The installed entry point beside this interpreter, as a user runs it; else the
    module (a tree that is not installed)."""
    script = Path(sys.executable).with_name("cpctl")
    return [str(script)] if script.exists() else [sys.executable, "-m",
                                                   "controlplane.cli.main"]


def verbs() -> list[list[str]]:
    """Every verb's argv, from the parser itself (so a new verb is timed too)."""
    from controlplane.cli.main import build_parser

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> list[list[str]]:
        found: list[list[str]] = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    # `history prune` is parsed as the verb `history-prune` (cli/retention.py)
                    head, _, tail = name.partition("-")
                    argv = [*prefix, head, tail] if tail and head in action.choices else [
                        *prefix, name]
                    found += walk(sub, argv) or [argv]
        return found

    return walk(build_parser(), [])


def timed(argv: list[str], runs: int) -> dict[str, float]:
    """Median and fastest wall seconds of ``runs`` runs, and the median CPU seconds (user +
    system) the process used: on a busy machine the wall time waits for a core, the CPU
    time much less. A failing command stops the run."""
    seconds, cpu = [], []
    for _ in range(runs):
        used = _children_cpu()
        started = time.perf_counter()
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, timeout=60)
        seconds.append(time.perf_counter() - started)
        cpu.append(_children_cpu() - used)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr}")
    return {"median_s": round(statistics.median(seconds), 3), "min_s": round(min(seconds), 3),
            "cpu_median_s": round(statistics.median(cpu), 3)}


def _children_cpu() -> float:
    """User + system seconds of this process's children that have exited."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def import_costs(args: list[str], top: int = 10) -> dict[str, list[list[Any]]]:
    """What ``cpctl ARGS`` spends importing (``-X importtime``), in milliseconds, two ways:
    ``top_level``, each import statement the entry point runs, by cumulative time (its own
    imports included: the first importer of SQLAlchemy is charged for it); ``by_package``,
    each top-level package's own time summed over its modules (SQLAlchemy's is
    SQLAlchemy's, whoever imported it)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "controlplane.cli.main",
                           *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=60)
    top_level: list[list[Any]] = []
    by_package: dict[str, float] = {}
    for m in map(_IMPORT_LINE.match, done.stderr.splitlines()):
        if m:
            if len(m[3]) == 1:  # one space: imported by the entry point itself
                top_level.append([m[4], int(m[2]) / 1000])
            package = m[4].split(".")[0]
            by_package[package] = by_package.get(package, 0.0) + int(m[1]) / 1000

    def heaviest(rows: list[list[Any]]) -> list[list[Any]]:
        return [[name, round(ms, 1)] for name, ms in sorted(rows, key=lambda r: -r[1])[:top]]

    return {"top_level": heaviest(top_level),
            "by_package": heaviest([[k, v] for k, v in by_package.items()])}


def measure(runs: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="cli_startup_") as workdir:
        db = f"sqlite:///{workdir}/bench.db"
        subprocess.run([*cpctl(), "--db", db, "db", "upgrade"], check=True,
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        commands: dict[str, dict[str, float]] = {
            "python -c pass": timed([sys.executable, "-c", "pass"], runs),
            "cpctl --help": timed([*cpctl(), "--help"], runs),
        }
        for argv in verbs():
            commands[f"cpctl {' '.join(argv)} --help"] = timed([*cpctl(), *argv, "--help"],
                                                               runs)
        commands["cpctl list"] = timed([*cpctl(), "--db", db, "list"], runs)
        imports = {"cpctl --help": import_costs(["--help"]),
                   "cpctl list": import_costs(["--db", db, "list"])}
    helps = {k: v for k, v in commands.items() if k.endswith("--help")}
    slowest_help = max(helps, key=lambda k: helps[k]["median_s"])
    return {
        "runs": runs, "entry_point": " ".join(cpctl()), "commands": commands,
        "cores": os.cpu_count(), "load_1m": [round(load_before, 2),
                                             round(os.getloadavg()[0], 2)],
        "targets_s": {"help": HELP_TARGET_S, "list": LIST_TARGET_S},
        "slowest_help": slowest_help,
        "help_target_met": helps[slowest_help]["median_s"] < HELP_TARGET_S,
        "list_target_met": commands["cpctl list"]["median_s"] < LIST_TARGET_S,
        "imports_ms": imports,
    }


def print_table(r: dict[str, Any]) -> None:
    print(f"cli_startup: {r['runs']} runs each of {r['entry_point']} (whole process); "
          f"load average {r['load_1m'][0]} -> {r['load_1m'][1]} on {r['cores']} core(s)")
    print(f"  {'command':<44}{'median s':>9}{'min s':>8}{'cpu s':>8}  target (median)")
    for command, t in r["commands"].items():
        target = (HELP_TARGET_S if command.endswith("--help")
                  else LIST_TARGET_S if command == "cpctl list" else None)
        mark = "" if target is None else (
            f"< {target}  " + ("ok" if t["median_s"] < target else "MISSED"))
        print(f"  {command:<44}{t['median_s']:>9.3f}{t['min_s']:>8.3f}"
              f"{t['cpu_median_s']:>8.3f}  {mark}")
    for command, costs in r["imports_ms"].items():
        print(f"  imports of {command} (-X importtime, ms): top-level statements by "
              "cumulative time | packages by their own time")
        for (name, ms), (package, own) in zip(costs["top_level"], costs["by_package"],
                                              strict=False):
            print(f"    {name:<34}{ms:>8.1f}   | {package:<24}{own:>8.1f}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cli_startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=7, metavar="N",
                   help="runs of each command (default: %(default)s)")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="write the JSON here instead of bench/results/cli_startup.json")
    args = p.parse_args()
    results = measure(args.runs)
    print_table(results)
    write_results("cli_startup", results, args.json)


if __name__ == "__main__":
    main()
