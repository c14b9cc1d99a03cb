"""Injected crashes for crash tests: rules that SIGKILL this process at a named point.

Production code paths call ``faults.reached(point, detail)`` on the
:class:`~controlplane.frontdoor.ports.Faults` their composition root passes in:
:data:`NO_FAULTS` unless a test built the process otherwise. Nothing read from the
environment or a deployment's configuration can enable a rule. A test starts the process
through the test-only entry ``tests/support/faulty_cpctl.py``::

    python -m tests.support.faulty_cpctl --crash-at frontdoor.submitted -- --db URL worker ...

which parses each ``--crash-at POINT[=PREFIX]`` with :meth:`CrashAt.parse` and hands a
:class:`CrashRules` to the composition roots that take ``faults``
(:func:`controlplane.wiring.cluster.run_product_worker`,
:func:`controlplane.cli.retention.prune_cmd`), then runs ``cpctl`` as usual.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controlplane.frontdoor.ports import NO_FAULTS, Faults

__all__ = ["NO_FAULTS", "POINTS", "CrashAt", "CrashRules", "Faults"]

#: Every fault point, and what ``detail`` it passes.
POINTS = {
    "frontdoor.submitted": "the front door created an operation and has not written the "
                           "resource's status yet (detail: the operation id)",
    "prune.progress": "`cpctl history prune` printed a progress line, after the batch it "
                      "reports committed (detail: the line, e.g. 'phase 1 (summaries): "
                      "batch 1: ...')",
}


@dataclass(frozen=True)
class CrashAt:
    """Crash at ``point`` when its detail starts with ``prefix`` (``""``: always)."""

    point: str
    prefix: str = ""

    @classmethod
    def parse(cls, spec: str) -> CrashAt:
        """``POINT`` or ``POINT=PREFIX``; ``ValueError`` naming the points if unknown."""
        point, _, prefix = spec.partition("=")
        if point not in POINTS:
            raise ValueError(f"unknown fault point {point!r}; points: {', '.join(POINTS)}")
        return cls(point, prefix)


def _sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class CrashRules:
    """:class:`Faults` that kill the process at the first rule hit (``kill``: a test of
    the rules themselves passes its own)."""

    def __init__(self, rules: Sequence[CrashAt], *,
                 kill: Callable[[], None] = _sigkill) -> None:
        self.rules = tuple(rules)
        self.kill = kill

    def reached(self, point: str, detail: str = "") -> None:
        if any(r.point == point and detail.startswith(r.prefix) for r in self.rules):
            self.kill()
