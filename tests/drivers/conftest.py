"""Fixtures of the driver tests: the cluster harness (simulator, and a real cluster if set).

``harness`` runs every contract test twice: on the simulator (never skipped) and on the
cluster named by ``CONTROLPLANE_TEST_KUBECONFIG`` (skipped, with that reason, when unset).
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
    async with open_harness(request.param, tmp_path) as h:
        yield h


@pytest.fixture
async def sim() -> AsyncIterator[SimCluster]:
    async with SimCluster(nodes=3) as cluster:
        yield cluster
