"""Scan the runtime sources for SQL text built from values (``python -m
tests.reliability.sqlscan`` prints the findings as JSON).

Run in a subprocess by ``test_security.py``: CPython 3.11 can raise a spurious
``SystemError: AST constructor recursion depth mismatch`` from ``ast.parse`` once another
thread of the same process has compiled code concurrently (gh-106905), which a long test
session with campaign threads may have done.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: SQL as this code base writes it: keywords in capitals (case-sensitive on purpose, so
#: English prose in messages does not count).
SQL_TEXT = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE)\b[\s\S]*\b(FROM|SET|INTO)\b|"
                      r"\b(WHERE|PRAGMA|DROP TABLE|CREATE TABLE|ALTER TABLE)\b")
EXECUTORS = ("text", "execute", "exec_driver_sql", "executemany", "fetch", "fetchval",
             "fetchrow")


def runtime_sources() -> list[Path]:
    return sorted([*ROOT.glob("controlplane/**/*.py"), *ROOT.glob("drivers/**/*.py")])


def sql_fstrings(path: Path) -> list[tuple[int, str]]:
    """Interpolated expressions inside f-strings that look like SQL."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.JoinedStr):
            continue
        text = "".join(v.value for v in node.values
                       if isinstance(v, ast.Constant) and isinstance(v.value, str))
        if SQL_TEXT.search(text):
            found += [(node.lineno, ast.unparse(v.value)) for v in node.values
                      if isinstance(v, ast.FormattedValue)]
    return found


def built_sql_calls(path: Path) -> list[tuple[int, str]]:
    """Calls of an SQL executor whose SQL is an f-string, a concatenation or ``.format``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in EXECUTORS:
            continue
        arg = node.args[0]
        if isinstance(arg, ast.JoinedStr | ast.BinOp) or (
                isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute)
                and arg.func.attr == "format"):
            found.append((node.lineno, ast.unparse(node)[:100]))
    return found


def main() -> None:
    report: dict[str, dict[str, list[tuple[int, str]]]] = {"fstrings": {}, "calls": {}}
    for path in runtime_sources():
        rel = path.relative_to(ROOT).as_posix()
        report["fstrings"][rel] = sql_fstrings(path)
        report["calls"][rel] = built_sql_calls(path)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
