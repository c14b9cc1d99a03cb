"""Command-line options naming the cluster and the registry (no driver is imported here,
so parsing stays fast; ``cli.cluster`` acts on them)."""

from __future__ import annotations

import argparse
import os


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster and registry")
    g.add_argument("--kubeconfig", default=os.environ.get("CONTROLPLANE_KUBECONFIG"),
                   help="kubeconfig of the cluster ($CONTROLPLANE_KUBECONFIG, else "
                   "$KUBECONFIG or in-cluster)")
    g.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    g.add_argument("--registry-layout", default=os.environ.get("CONTROLPLANE_REGISTRY_LAYOUT"),
                   help="OCI layouts on disk under this directory, instead of registries "
                   "over HTTP ($CONTROLPLANE_REGISTRY_LAYOUT)")
    g.add_argument("--registry-plain-http", action="append", default=[], metavar="HOST",
                   help="speak plain HTTP to this registry host (loopback always is)")
    g.add_argument("--registry-credentials", nargs=3, action="append", default=[],
                   metavar=("HOST", "USER", "PASSWORD_FILE"))
