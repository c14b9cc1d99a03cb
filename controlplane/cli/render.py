"""Print records as a table (for people) or JSON (for scripts)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from datetime import datetime
from typing import Any, TextIO

import yaml


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError(f"cannot render {type(value).__name__}")


def as_json(value: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout  # looked up per call: a redirected stdout is honoured
    out.write(json.dumps(value, default=_default, indent=2, sort_keys=True) + "\n")


def as_yaml(value: Any, out: TextIO | None = None) -> None:
    """The same document as ``as_json`` (times as ISO strings), in YAML."""
    out = out or sys.stdout
    plain = json.loads(json.dumps(value, default=_default))
    out.write(yaml.safe_dump(plain, sort_keys=True, default_flow_style=False,
                             allow_unicode=True))


def structured(value: Any, output: str, out: TextIO | None = None) -> None:
    """``-o json`` or ``-o yaml``."""
    (as_yaml if output == "yaml" else as_json)(value, out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO | None = None,
          max_width: int = 80, fill: int | None = None, width: int | None = None) -> None:
    """Print ``rows`` under ``headers``, each cell cut to ``max_width``. With ``fill``
    (a column index) and ``width`` (the terminal's), that column gets the room the others
    leave, at least 20 characters, and its cells are cut to it instead."""
    out = out or sys.stdout
    cells = [[_cell(v) for v in row] for row in rows]
    limits = [max_width] * len(headers)
    if fill is not None and width is not None:
        limits[fill] = 10**9
    cells = [[c if len(c) <= limits[i] else c[: limits[i] - 1] + "…" for i, c in enumerate(row)]
             for row in cells]
    if fill is not None and width is not None:
        others = sum(max([len(h)] + [len(r[i]) for r in cells])
                     for i, h in enumerate(headers) if i != fill)
        room = max(20, width - others - 2 * (len(headers) - 1))
        for row in cells:
            if len(row[fill]) > room:
                row[fill] = row[fill][: room - 1] + "…"
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    out.write("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))
              .rstrip() + "\n")
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
