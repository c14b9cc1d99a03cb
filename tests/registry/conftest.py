"""Fixtures of the registry tests: each backend of the registry port, ready to use.

``backend`` runs a contract test twice: on the on-disk OCI layout and on a real
distribution registry on loopback (never skipped: a missing registry fails, pointing at
``scripts/ensure-registry``). ``refusing_backend`` is the same pair with deletes
disabled (the registry answers 405).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.registry.backends import Backend, open_backend


@pytest.fixture(params=["layout", "distribution"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async for b in open_backend(request.param, tmp_path, delete=True):
        yield b


@pytest.fixture(params=["layout", "distribution"])
async def refusing_backend(request: pytest.FixtureRequest,
                           tmp_path: Path) -> AsyncIterator[Backend]:
    async for b in open_backend(request.param, tmp_path, delete=False):
        yield b
