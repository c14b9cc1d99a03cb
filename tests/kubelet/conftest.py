"""``world``: every kubelet-role test runs on the simulator (in-process kubelets off, the
role in-process) and on the session's real API server (the role as ``cpctl sim nodes``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.kubelet.world import World, open_world


@pytest.fixture(params=["sim", pytest.param("real", marks=pytest.mark.slow)])
async def world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    real = request.getfixturevalue("real_cluster") if request.param == "real" else None
    async with open_world(request.param, tmp_path, real) as w:
        yield w
