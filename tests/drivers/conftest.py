"""Fixtures of the driver tests: the cluster harness (simulator, and a real cluster if set).

``harness`` runs every contract test twice: on the simulator (never skipped) and on the
session's real API server (``real_cluster``: envtest from ``KUBEBUILDER_ASSETS``, or the
cluster named by ``CONTROLPLANE_TEST_KUBECONFIG``; skipped with one line saying how to
enable it when neither is set).
``sim`` is a bare simulated cluster for the simulator's own tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from drivers.sim import SimCluster
from tests.drivers.harness import Harness, open_harness


@pytest.fixture(params=["sim", "real"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    real = request.getfixturevalue("real_cluster") if request.param == "real" else None
    async with open_harness(request.param, tmp_path, real) as h:
        yield h


@pytest.fixture
async def sim() -> AsyncIterator[SimCluster]:
    async with SimCluster(nodes=3) as cluster:
        yield cluster
