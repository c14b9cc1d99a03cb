"""``--kube-qps``/``--kube-burst`` (and their environment variables) reach the Kubernetes
driver's settings through ``product()``, on every verb that talks to the cluster."""

from __future__ import annotations

import pytest

from controlplane.cli.main import build_parser
from controlplane.wiring.cluster import connect_options


def test_the_flags_become_the_drivers_rate_limit() -> None:
    args = build_parser().parse_args(
        ["worker", "--kubeconfig", "k.yaml", "--kube-qps", "0", "--kube-burst", "7"])
    kube = connect_options(args)["kube"]
    assert (kube.qps, kube.burst) == (0.0, 7)


def test_the_environment_sets_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_KUBE_QPS", "250")
    args = build_parser().parse_args(["drain", "node-1"])
    kube = connect_options(args)["kube"]
    assert (kube.qps, kube.burst) == (250.0, 100)


def test_without_them_the_driver_keeps_client_gos_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONTROLPLANE_KUBE_QPS", raising=False)
    monkeypatch.delenv("CONTROLPLANE_KUBE_BURST", raising=False)
    kube = connect_options(build_parser().parse_args(["worker"]))["kube"]
    assert (kube.qps, kube.burst) == (50.0, 100)
