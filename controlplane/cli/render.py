"""Print records as a table (for people) or JSON (for scripts).

The parser imports this module (through ``checkpoints`` and ``history``): PyYAML is
imported by ``-o yaml`` only."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Collection, Sequence
from dataclasses import asdict, is_dataclass
from datetime import datetime
from typing import Any, TextIO


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
    import yaml

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


def terminal_width(out: TextIO) -> int | None:
    """The width tables must fit: the terminal's (``$COLUMNS`` overrides it) when ``out``
    is one; ``None`` (no limit) for a pipe or a file, so scripts get whole values."""
    return shutil.get_terminal_size().columns if out.isatty() else None


def colours_on(out: TextIO) -> bool:
    """Colour only on a terminal, never with ``NO_COLOR`` set (no-color.org) or
    ``TERM=dumb``."""
    return (out.isatty() and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM") != "dumb")


BOLD, GREEN, RED, RESET = "\x1b[1m", "\x1b[32m", "\x1b[31m", "\x1b[0m"
#: Columns whose values say how something ended; they are coloured on a terminal.
STATUS_COLUMNS = frozenset({"phase", "status", "outcome", "phase/outcome", "restorable"})
GOOD = frozenset({"Succeeded", "Suspended", "Resumed", "moved", "yes"})
BAD = frozenset({"Failed", "Cancelled", "RolledBack", "TimedOut", "failed", "refused", "no"})


def tone(cell: str) -> str:
    """The colour a status cell is shown in ("" for none): green for success, red for a
    failure; an arrow (``-> Failed``) is read past."""
    return _tone(cell)


def _tone(cell: str) -> str:
    word = cell.removeprefix("-> ").split(" ", 1)[0].rstrip(":,;")
    return GREEN if word in GOOD else RED if word in BAD else ""


def _fit(widths: list[int], headers: Sequence[str], room: int, fill: int | None,
         whole: set[int]) -> list[int]:
    """Narrow columns until the row fits ``room``: the ``fill`` column first (down to 20
    characters), then the widest, one character at a time (a column keeps at least its
    header or 8 characters, whichever is longer; the ``whole`` ones, times, are not cut)."""
    floors = [w if i in whole else min(w, max(len(h), 8))
              for i, (w, h) in enumerate(zip(widths, headers, strict=True))]
    widths = list(widths)
    excess = sum(widths) + 2 * (len(widths) - 1) - room
    if fill is not None and excess > 0:
        cut = min(excess, max(0, widths[fill] - max(20, floors[fill])))
        widths[fill] -= cut
        excess -= cut
    while excess > 0:
        shrinkable = [i for i, w in enumerate(widths) if w > floors[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return widths


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def age(then: datetime, now: datetime) -> str:
    """How long ago, as kubectl says it: 45s, 12m, 3h, 2d."""
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO | None = None,
          max_width: int = 80, fill: int | None = None, width: int | None = None, *,
          wide: bool = False, whole: Collection[int] = ()) -> None:
    """Print ``rows`` under ``headers``.

    ``wide``: every value whole. Otherwise each cell is cut to ``max_width`` (except the
    ``fill`` column, which takes what room is left), then the widest columns are narrowed
    until the table fits ``width`` (default: the terminal's, see :func:`terminal_width`);
    a cut value ends in ``…``. Times and the ``whole`` columns (ids, to copy) are never
    narrowed. On a terminal the headers are bold and the status columns
    green or red (:func:`colours_on`).
    """
    out = out or sys.stdout
    cells = [[_cell(v) for v in row] for row in rows]
    if not wide:
        cells = [[c if i == fill else _cut(c, max_width) for i, c in enumerate(row)]
                 for row in cells]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    room = None if wide else (width if width is not None else terminal_width(out))
    if room is not None:
        times = {i for i in range(len(headers)) if any(isinstance(r[i], datetime) for r in rows)
                 and all(isinstance(r[i], datetime) or r[i] is None for r in rows)}
        widths = _fit(widths, headers, room, fill, times | set(whole))
        cells = [[_cut(c, widths[i]) for i, c in enumerate(row)] for row in cells]
    colour = colours_on(out)
    status = {i for i, h in enumerate(headers) if h.lower() in STATUS_COLUMNS}

    def line(values: Sequence[str], header: bool = False) -> str:
        parts = []
        for i, (value, w) in enumerate(zip(values, widths, strict=True)):
            pad = " " * (w - len(value))
            style = (BOLD if header else _tone(value) if i in status else "") if colour else ""
            parts.append(f"{style}{value}{RESET}{pad}" if style else value + pad)
        return "  ".join(parts).rstrip()

    out.write(line([h.upper() for h in headers], header=True) + "\n")
    for row in cells:
        out.write(line(row) + "\n")
