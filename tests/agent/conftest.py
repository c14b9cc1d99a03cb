"""Fixtures of the agent tests: ``world`` runs a test on the OCI layout AND a real registry."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.agent.world import World, open_world


@pytest.fixture(params=["layout", "distribution"])
async def world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    async with open_world(tmp_path, registry=request.param) as w:
        yield w


@pytest.fixture
async def layout_world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world(tmp_path, registry="layout") as w:
        yield w
