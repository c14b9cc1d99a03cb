"""Test-only entry: ``cpctl`` with injected crash rules. Never part of a deployment.

    python -m tests.support.faulty_cpctl --crash-at POINT[=PREFIX] [...] -- CPCTL-ARGS...

Builds :class:`controlplane.wiring.faults.CrashRules` from each ``--crash-at`` (points:
``controlplane.wiring.faults.POINTS``), binds them as the ``faults`` argument of the
composition roots that take one (``wiring.cluster.run_product_worker``,
``cli.retention.prune_cmd``), then runs ``cpctl`` with the rest of the command line. The
process is SIGKILLed at the first rule hit. Used by the crash tests
(tests/frontdoor/test_front_door_real.py, tests/cli/test_history_prune.py).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence

from controlplane.cli import main as cpctl
from controlplane.cli import retention
from controlplane.wiring import cluster
from controlplane.wiring.faults import CrashAt, CrashRules


def command(cpctl_args: Sequence[str], *crash_at: str) -> list[str]:
    """The argv (after the interpreter) that runs ``cpctl cpctl_args`` with the rules."""
    return ["-m", __name__, *(f"--crash-at={spec}" for spec in crash_at), "--",
            *cpctl_args]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="faulty_cpctl")
    parser.add_argument("--crash-at", action="append", required=True, type=CrashAt.parse,
                        metavar="POINT[=PREFIX]")
    parser.add_argument("cpctl", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.cpctl[1:] if args.cpctl[:1] == ["--"] else args.cpctl
    faults = CrashRules(args.crash_at)
    # The composition roots are looked up when a verb runs (``cpctl worker`` imports
    # run_product_worker then; the parser binds prune_cmd when it is built).
    setattr(cluster, "run_product_worker",  # noqa: B010
            functools.partial(cluster.run_product_worker, faults=faults))
    setattr(retention, "prune_cmd",  # noqa: B010
            functools.partial(retention.prune_cmd, faults=faults))
    return cpctl.main(rest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
