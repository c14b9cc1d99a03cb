"""How ``cpctl history`` prints a timeline for a person: each event on a line of its own
(sequence, time, event, and the phase it led to), then, indented beneath it as
``kubectl describe`` does, the event's own words, who recorded it and the facts it
observed — whole, wrapped to the terminal, never cut. Through a pipe nothing is
wrapped (a line per item); ``--wide`` keeps the one-row-per-event table instead.

Pure: it formats rows it is given (:class:`Line`), for :mod:`controlplane.cli.reading`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.cli.render import BOLD, RESET, tone

INDENT = " " * 7  # under the event's name: past "SEQ  " and a little more


@dataclass(frozen=True)
class Line:
    """One event as the history shows it."""

    seq: int
    at: datetime
    event: str
    phase: str  # the phase it led to ("": unchanged)
    said: str  # its own words: reason and message, or its data as key=value
    by: str
    observed: str  # the facts it observed, key=value


def describe(lines: Sequence[Line], *, width: int | None, colour: bool) -> list[str]:
    """The timeline's printed lines; ``width`` ``None``: nothing is wrapped."""
    out = [_bold("SEQ  TIME                     EVENT  -> PHASE", colour)]
    for line in lines:
        head = f"{line.seq:>3}  {line.at.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}  {line.event}"
        if line.phase:
            arrow = f"-> {line.phase}"
            style = tone(arrow) if colour else ""
            head += f"  {style}{arrow}{RESET}" if style else f"  {arrow}"
        out.append(head)
        for label, text in (("", line.said), ("by ", line.by),
                            ("observed ", line.observed)):
            if text:
                out.extend(_wrapped(label + " ".join(text.split()), width))
    return out


def _wrapped(text: str, width: int | None) -> list[str]:
    if width is None:
        return [INDENT + text]
    return textwrap.wrap(text, width=max(width - 1, len(INDENT) + 20),
                         initial_indent=INDENT, subsequent_indent=INDENT + "  ",
                         break_on_hyphens=False)


def _bold(text: str, colour: bool) -> str:
    return f"{BOLD}{text}{RESET}" if colour else text
