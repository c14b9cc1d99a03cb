"""Bar charts as SVG text: pure functions from values to markup (no I/O, no clock).

Used by :mod:`controlplane.api.summary_charts` for the summary page. Bars are horizontal
(a label per row never collides with its neighbour), grouped or stacked. Each series has a
colour *and* a fill pattern and a legend entry, every bar a ``<title>`` with its value, and
the chart a ``<title>``/``<desc>`` that a screen reader reads (``role="img"``). Every piece
of text is escaped; only presentation attributes are used (no ``style``), so the page's
CSP needs no ``'unsafe-inline'``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from html import escape

WIDTH = 720
BAR = 14  # one bar's thickness
GAP = 10  # between two groups
CHAR = 6.6  # rough width of one character of 12px text, to fit labels
#: Okabe-Ito colours (readable with the common colour-vision deficiencies).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442")
_NAME = re.compile(r"[a-z][a-z0-9-]{0,40}")
_COLOUR = re.compile(r"#[0-9A-Fa-f]{6}")


def count(value: float) -> str:
    return f"{value:g}" if value < 1e6 else f"{value:.3g}"


def seconds(value: float) -> str:
    if value == 0:
        return "0 s"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def size(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Series:
    """One kind of bar: its name (in the legend) and a value per group."""

    name: str
    values: tuple[float, ...]
    colour: str | None = None  # ``#rrggbb``; the palette's next one if None


@dataclass(frozen=True)
class BarChart:
    """``name`` prefixes the SVG's ids (several charts share one page), so it is
    ``[a-z][a-z0-9-]*``. ``groups`` label the rows; each series has one value per group."""

    name: str
    title: str
    description: str
    groups: tuple[str, ...]
    series: tuple[Series, ...]
    stacked: bool = False
    unit: Callable[[float], str] = count

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"chart name {self.name!r} is not [a-z][a-z0-9-]*")
        for s in self.series:
            if len(s.values) != len(self.groups):
                raise ValueError(f"series {s.name!r} has {len(s.values)} values "
                                 f"for {len(self.groups)} groups")
            if s.colour is not None and not _COLOUR.fullmatch(s.colour):
                raise ValueError(f"colour {s.colour!r} is not #rrggbb")


def ticks(top: float, *, whole: bool = False) -> list[float]:
    """Round axis values from 0 to at least ``top`` (about four steps); ``whole`` for
    counts (no step below 1)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    if whole:
        step = max(1, math.ceil(step))
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def _axis_values(unit: Callable[[float], str], top: float) -> list[float]:
    if unit is size and top >= 1024:  # round in the unit shown: 20 KiB, not 19.5 KiB
        scale = 1024 ** min(3, int(math.log(top, 1024)))
        return [t * scale for t in ticks(top / scale)]
    return ticks(top, whole=unit is count)


def render(chart: BarChart) -> str:
    """The chart as a standalone ``<svg>`` element."""
    if not chart.groups or not chart.series or all(
            v == 0 for s in chart.series for v in s.values):
        return _empty(chart)
    colours = _colours(chart.series)
    label_width = min(240, max(60, CHAR * max(len(g) for g in chart.groups) + 12))
    value_room = 90
    plot_x, plot_w = label_width, WIDTH - label_width - value_room
    band = BAR if chart.stacked else BAR * len(chart.series)
    top = 58  # title and legend above the plot
    height = top + len(chart.groups) * (band + GAP) + 40
    highest = max((sum(s.values[i] for s in chart.series) if chart.stacked
                   else max(s.values[i] for s in chart.series))
                  for i in range(len(chart.groups)))
    axis = _axis_values(chart.unit, highest)
    scale = plot_w / axis[-1]
    out = [_open(chart, height), _defs(chart.name, colours),
           _text(8, 20, chart.title, size=15, weight="600"), _legend(chart, colours)]
    for i, group in enumerate(chart.groups):
        y = top + i * (band + GAP)
        out.append(f'<g class="group" data-group="{escape(group)}">')
        out.append(_text(plot_x - 6, y + band / 2 + 4, _fit(group, label_width - 12),
                         anchor="end", tooltip=group))
        x = float(plot_x)
        for k, s in enumerate(chart.series):
            value = s.values[i]
            width = value * scale
            bar_y = y if chart.stacked else y + k * BAR
            if chart.stacked and value == 0:
                continue  # a zero segment would be an invisible bar with a tooltip
            out.append(
                f'<rect class="bar" data-series="{escape(s.name)}" data-value="{value:g}" '
                f'x="{x:.2f}" y="{bar_y}" width="{width:.2f}" height="{BAR - 2}" '
                f'fill="url(#{chart.name}-p{k})" stroke="{colours[k]}">'
                f"<title>{escape(f'{group} — {s.name}: {chart.unit(value)}')}</title></rect>")
            if chart.stacked:
                x += width
            else:
                out.append(_text(x + width + 4, bar_y + BAR - 3, chart.unit(value), size=11))
        if chart.stacked:
            total = sum(s.values[i] for s in chart.series)
            out.append(_text(x + 4, y + BAR - 3, chart.unit(total), size=11))
        out.append("</g>")
    out.append(_axis(chart, axis, plot_x, scale, height - 34))
    out.append("</svg>")
    return "".join(out)


def _colours(series: Sequence[Series]) -> list[str]:
    return [s.colour or PALETTE[k % len(PALETTE)] for k, s in enumerate(series)]


def _open(chart: BarChart, height: float) -> str:
    summary = "; ".join(
        f"{g}: " + ", ".join(f"{s.name} {chart.unit(s.values[i])}" for s in chart.series)
        for i, g in enumerate(chart.groups)) or "no data"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{chart.name}" '
            f'role="img" aria-labelledby="{chart.name}-title {chart.name}-desc" '
            f'width="{WIDTH}" height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}" '
            'font-family="system-ui, sans-serif" font-size="12" fill="#1d2330">'
            f'<title id="{chart.name}-title">{escape(chart.title)}</title>'
            f'<desc id="{chart.name}-desc">{escape(chart.description)}. {escape(summary)}'
            "</desc>")


#: Overlays that tell the series apart without colour: none, diagonal, dots, cross, ...
_OVERLAYS = ("", '<path d="M0,6 L6,0" stroke="#fff" stroke-width="1.5"/>',
             '<circle cx="3" cy="3" r="1.3" fill="#fff"/>',
             '<path d="M0,3 H6 M3,0 V6" stroke="#fff" stroke-width="1.2"/>',
             '<path d="M0,0 L6,6" stroke="#fff" stroke-width="1.5"/>',
             '<path d="M0,1.5 H6 M0,4.5 H6" stroke="#fff" stroke-width="1"/>')


def _defs(name: str, colours: Sequence[str]) -> str:
    patterns = "".join(
        f'<pattern id="{name}-p{k}" width="6" height="6" patternUnits="userSpaceOnUse">'
        f'<rect width="6" height="6" fill="{colour}"/>{_OVERLAYS[k % len(_OVERLAYS)]}'
        "</pattern>" for k, colour in enumerate(colours))
    return f"<defs>{patterns}</defs>"


def _legend(chart: BarChart, colours: Sequence[str]) -> str:
    out, x = ['<g class="legend">'], 8.0
    for k, s in enumerate(chart.series):
        out.append(f'<rect x="{x:.1f}" y="32" width="14" height="12" '
                   f'fill="url(#{chart.name}-p{k})" stroke="{colours[k]}"/>')
        out.append(_text(x + 18, 42, s.name))
        x += 18 + CHAR * len(s.name) + 18
    out.append("</g>")
    return "".join(out)


def _axis(chart: BarChart, axis: Sequence[float], x0: float, scale: float, y: float) -> str:
    out = [f'<g class="axis"><line x1="{x0}" y1="{y}" x2="{x0 + axis[-1] * scale:.2f}" '
           f'y2="{y}" stroke="#5f6673"/>']
    for value in axis:
        x = x0 + value * scale
        out.append(f'<line x1="{x:.2f}" y1="{y}" x2="{x:.2f}" y2="{y + 4}" stroke="#5f6673"/>')
        out.append(_text(x, y + 16, chart.unit(value), size=11, anchor="middle"))
    out.append("</g>")
    return "".join(out)


def _empty(chart: BarChart) -> str:
    bare = replace(chart, groups=(), series=())
    return (_open(bare, 90).replace('class="chart"', 'class="chart empty"', 1)
            + _text(8, 20, chart.title, size=15, weight="600")
            + _text(8, 56, "no data yet", size=13) + "</svg>")


def _fit(label: str, width: float) -> str:
    room = max(4, int(width / CHAR))
    return label if len(label) <= room else label[:room - 1] + "…"


def _text(x: float, y: float, text: str, *, size: int | None = None,
          weight: str | None = None, anchor: str | None = None,
          tooltip: str | None = None) -> str:
    attrs = f'x="{x:.1f}" y="{y:.1f}"'
    if size is not None:
        attrs += f' font-size="{size}"'
    if weight is not None:
        attrs += f' font-weight="{weight}"'
    if anchor is not None:
        attrs += f' text-anchor="{anchor}"'
    title = f"<title>{escape(tooltip)}</title>" if tooltip and tooltip != text else ""
    return f"<text {attrs}>{title}{escape(text)}</text>"
