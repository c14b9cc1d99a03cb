"""Command-line options shared by several verbs: the database, the cluster and the
registry, the admission limits, and argparse's number types. The parser imports this
module, so it imports nothing beyond the standard library and ``controlplane.errors``
(``cli.cluster`` acts on the options; tests/cli/test_startup_imports.py pins it)."""

from __future__ import annotations

import argparse
import math
import os
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from controlplane.clock import instant
from controlplane.errors import UsageError

if TYPE_CHECKING:
    from controlplane.machines.submission import Limits

DEFAULT_SQLITE_PATH = "var/controlplane.db"


T = TypeVar("T", int, float)


def default_url() -> str:
    """``--db``'s default: ``$CONTROLPLANE_DATABASE_URL``, else the embedded SQLite file
    under ``./var``."""
    return os.environ.get("CONTROLPLANE_DATABASE_URL", f"sqlite:///{DEFAULT_SQLITE_PATH}")


def add_registry_options(g: argparse._ActionsContainer) -> None:
    """How to reach the registries: the ``--registry-*`` flags."""
    g.add_argument("--registry-layout", default=os.environ.get("CONTROLPLANE_REGISTRY_LAYOUT"),
                   help="OCI layouts on disk under this directory, instead of registries "
                   "over HTTP ($CONTROLPLANE_REGISTRY_LAYOUT)")
    g.add_argument("--registry-plain-http", action="append", default=[], metavar="HOST",
                   help="speak plain HTTP to this registry host (loopback always is)")
    g.add_argument("--registry-credentials", nargs=3, action="append", default=[],
                   metavar=("HOST", "USER", "PASSWORD_FILE"))


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster and registry")
    g.add_argument("--kubeconfig", default=os.environ.get("CONTROLPLANE_KUBECONFIG"),
                   help="kubeconfig of the cluster ($CONTROLPLANE_KUBECONFIG, else "
                   "$KUBECONFIG or in-cluster)")
    g.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    g.add_argument("--kube-qps", type=_requests_per_second,
                   default=os.environ.get("CONTROLPLANE_KUBE_QPS", "50"),
                   help="client-side limit on API requests per second, as client-go's "
                   "(default 50, $CONTROLPLANE_KUBE_QPS; 0: no limit)")
    g.add_argument("--kube-burst", type=_burst,
                   default=os.environ.get("CONTROLPLANE_KUBE_BURST", "100"),
                   help="requests allowed at once above --kube-qps (default 100, "
                   "$CONTROLPLANE_KUBE_BURST)")
    add_registry_options(g)
    g.add_argument("--trusted-key", action="append", default=[], metavar="PEM",
                   help="the agents' signing public key (repeatable while rotating): a "
                   "capture's artifact is pinned only if one of them signed it, so a "
                   "forged push under the right tag never is (docs/security.md)")
    limits = p.add_argument_group("admission limits (beyond them operations queue)")
    limits.add_argument("--max-operations", type=int,
                        default=int(os.environ.get("CONTROLPLANE_MAX_OPERATIONS", "10")),
                        help="operations running at once in the cluster (default 10, "
                        "$CONTROLPLANE_MAX_OPERATIONS)")
    limits.add_argument("--max-per-node", type=int,
                        default=int(os.environ.get("CONTROLPLANE_MAX_PER_NODE", "2")),
                        help="operations moving load off one node at once (default 2, "
                        "$CONTROLPLANE_MAX_PER_NODE)")


def _requests_per_second(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of requests per second >= 0 (0: no limit)")
    return value


def _burst(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of requests >= 1")
    return int(text)


def limits_from(args: argparse.Namespace) -> Limits:
    """The admission limits the verbs submit under and the worker admits under."""
    from controlplane.engine.decider import InvalidSpec
    from controlplane.machines.submission import Limits  # the machines: not for --help

    try:
        return Limits(max_cluster=args.max_operations, max_per_source_node=args.max_per_node)
    except InvalidSpec as exc:
        raise UsageError(str(exc).replace("limits.max_cluster", "--max-operations")
                         .replace("limits.max_per_source_node", "--max-per-node")) from None


def _bounded(text: str, kind: type[T], what: str, low: str, high: T) -> T:
    """``text`` as a ``kind`` above 0 and at most ``high`` (an argparse type's check)."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not 0 < value <= high:
        raise argparse.ArgumentTypeError(f"{value} is not between {low} and {high}")
    return value


def positive_int(text: str) -> int:
    """A flag's whole number from 1 to 1,000,000 (an argparse type)."""
    return _bounded(text, int, "an integer", "1", 1_000_000)


def positive_float(text: str) -> float:
    """A flag's number of seconds, above 0 and at most a day (an argparse type)."""
    return _bounded(text, float, "a number", "0", 86400)


def instant_flag(text: str) -> datetime:
    """A flag's ISO time, UTC unless it says (an argparse type)."""
    try:
        return instant(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO time (e.g. 2026-11-22T10:00:00Z)") from None
