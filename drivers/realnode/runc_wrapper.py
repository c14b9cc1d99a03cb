"""The OCI runtime CRI-O runs on a real node: runc, after fitting the bundle to this host.

CRI-O's ``runtime_path`` names a two-line script (:func:`script`) that runs this file with
the interpreter and no site packages (it needs the standard library only), passing runc's
arguments on. Before ``create``, ``run`` and ``restore`` it edits the bundle's
``config.json`` (:func:`fit_spec`, pure), then execs runc with the arguments unchanged:

- the capability bounding set here lacks ``CAP_SYS_RESOURCE``, so a negative
  ``process.oomScoreAdj`` (CRI-O asks -998 for the pause container, the kubelet -997 for
  Guaranteed pods) fails with "failed to update /proc/self/oom_score_adj: Permission
  denied": a negative value becomes 0;
- cgroups are v1 with hugetlb only on the v2 mount, so ``linux.resources.hugepageLimits``
  fails with "cannot set hugetlb limit": it is dropped when no v1 hugetlb hierarchy exists.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

EDITED = ("create", "run", "restore")
#: runc's global options that take a value (``runc --root R --log L create ...``).
GLOBAL_WITH_VALUE = ("--root", "--log", "--log-format", "--criu", "--rootless")


def fit_spec(spec: dict[str, Any], *, v1_hugetlb: bool) -> dict[str, Any]:
    """The OCI spec this host can run: a copy, the two fixes above applied."""
    fitted: dict[str, Any] = json.loads(json.dumps(spec))
    process = fitted.get("process") or {}
    if isinstance(process.get("oomScoreAdj"), int) and process["oomScoreAdj"] < 0:
        process["oomScoreAdj"] = 0
    resources = (fitted.get("linux") or {}).get("resources") or {}
    if not v1_hugetlb:
        resources.pop("hugepageLimits", None)
    return fitted


def command_and_bundle(argv: list[str], cwd: Path) -> tuple[str | None, Path]:
    """runc's command and the bundle it acts on (``--bundle``/``-b``, else the cwd)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        flag = argv[i]
        i += 2 if flag in GLOBAL_WITH_VALUE else 1
    command = argv[i] if i < len(argv) else None
    bundle = cwd
    rest = argv[i + 1:]
    for j, arg in enumerate(rest):
        if arg in ("--bundle", "-b") and j + 1 < len(rest):
            bundle = Path(rest[j + 1])
        elif arg.startswith(("--bundle=", "-b=")):
            bundle = Path(arg.split("=", 1)[1])
    return command, bundle


def has_v1_hugetlb(mounts: str) -> bool:
    """Whether /proc/self/mounts lists a cgroup v1 hierarchy with the hugetlb controller."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup" and "hugetlb" in fields[3].split(","):
            return True
    return False


def script(*, python: str, runc: str) -> str:
    """The executable CRI-O runs as its runtime (``runtime_path``)."""
    return (f"#!/bin/sh\nREALNODE_RUNC={runc} exec {python} -I -S {Path(__file__).resolve()}"
            ' "$@"\n')


def main(argv: list[str]) -> None:
    runc = os.environ.get("REALNODE_RUNC", "/usr/sbin/runc")
    command, bundle = command_and_bundle(argv, Path.cwd())
    config = bundle / "config.json"
    if command in EDITED and config.is_file():
        spec = json.loads(config.read_text())
        fitted = fit_spec(spec, v1_hugetlb=has_v1_hugetlb(Path("/proc/self/mounts").read_text()))
        if fitted != spec:
            partial = config.with_suffix(".json.fitting")
            partial.write_text(json.dumps(fitted))
            partial.replace(config)
    os.execv(runc, [runc, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
