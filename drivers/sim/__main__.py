"""``python -m drivers.sim up ...``: the same command as ``cpctl sim up ...``, for scripts.

One command, one set of flags, one ready line: the flags are defined, checked and
documented by ``cpctl sim`` (:mod:`controlplane.cli.sim`, ``docs/simulator.md``), and
this entry point hands its arguments to it, so ``python -m drivers.sim nodes`` is
``cpctl sim nodes`` too. Kept because benchmarks, fault campaigns and tests start the
simulator with ``sys.executable -m drivers.sim``, which needs no installed ``cpctl``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    # Imported here: a library module of the simulator never reaches up into the CLI.
    from controlplane.cli.main import main as cpctl

    return cpctl(["sim", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
