"""Database faults: PostgreSQL stopped and restarted in the middle of a migration run.

A throwaway PostgreSQL of this test's own (``throwaway_pg``: the shared server is not
touched) holds the campaign's database. While 3 ``cpctl worker`` processes migrate pods
through the simulator, the server is stopped (fast shutdown: every connection cut) for a
few seconds and started again, twice. The workers must back off, reconnect and finish
without a restart of their own: every operation terminal, histories gap-free, no pod
lost or duplicated, ``replay --verify`` clean — the crash campaign's invariants.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.campaign import Campaign, CampaignConfig
from tests.reliability.outages import outages
from tests.reliability.throwaway_pg import throwaway_postgres

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.mark.timeout(240)
async def test_workers_ride_out_postgresql_restarts_and_finish_every_migration(
        tmp_path: Path) -> None:
    with throwaway_postgres() as server:
        cfg = CampaignConfig(migrations=40, workers=3, seed=3, kills=False,
                             pg_admin_url=server.admin_url)
        campaign = Campaign(cfg, tmp_path, disturbers=[
            outages(server, after=(8, 24), down_seconds=3.0)])
        result = await campaign.run()
    print(result.summary())
    assert result.db_outages == 2
    assert not result.violations, result.summary()
    assert sum(result.outcomes.values()) == 40
    assert result.outcomes["Succeeded"] == 40, result.summary()
    assert result.restarts == 0  # the same worker processes finished the run
