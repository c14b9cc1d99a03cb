"""Prometheus text exposition (format 0.0.4), written by hand: families, samples and
cumulative histograms. Shared by the API's ``/metrics`` (figures read from the database)
and a worker's own ``/metrics`` (its process counters). Pure formatting, no I/O.
"""

from __future__ import annotations

import math

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Durations span seconds (a checkpoint phase) to tens of minutes (a stuck migration).
BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Exposition:
    """Accumulates metric families; ``text()`` renders them."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, **labels: str) -> None:
        self._lines.append(f"{name}{_labels(**labels)} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def histogram(out: Exposition, name: str, label: str,
              values: dict[str, list[float]]) -> None:
    """Cumulative ``_bucket``/``_sum``/``_count`` samples per label value."""
    for key in sorted(values):
        observed = values[key]
        for bound in (*BUCKETS, math.inf):
            le = "+Inf" if math.isinf(bound) else _number(bound)
            out.sample(f"{name}_bucket", sum(1 for v in observed if v <= bound),
                       **{label: key, "le": le})
        out.sample(f"{name}_sum", sum(observed), **{label: key})
        out.sample(f"{name}_count", len(observed), **{label: key})

