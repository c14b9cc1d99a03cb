"""Fault campaign (CI size): migrations through a hostile cluster and a hostile registry,
3 worker processes on PostgreSQL (``tests.reliability.fault_world``).

Injected: API 500/429/409 at rates, latency, watches dropped mid-stream and expired
(410) every few seconds, slow pod start, nodes failing (NotReady) for a few seconds —
often mid-restore; registry 503s, slow blobs, tags vanishing for a moment, and a
persistent 403 on manifest DELETE in one repository. The same invariants as the crash
campaign hold (nothing lost, nothing duplicated, every operation terminal and truthful,
replay exact), and:

- a persistent GC refusal ends as ``GarbageCollectionFailed`` (never ``Succeeded``) and is
  visible as the machine's condition, Kubernetes Warning events and the
  ``controlplane_gc_failures_total`` metric;
- the registry password (worker ``--registry-credentials``, agents) and the API token
  (used against the campaign's database, ``?token=`` included) appear in no worker log,
  API log, event, decision, machine row, Kubernetes Event or pod.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.campaign import Campaign, CampaignConfig

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.mark.timeout(300)
async def test_migrations_through_api_registry_and_node_faults_lose_nothing(
        tmp_path: Path) -> None:
    result = await Campaign(CampaignConfig(migrations=80, workers=3, seed=0, profile="faults",
                                           kills=False), tmp_path).run()
    print(result.summary())
    assert not result.violations, result.summary()
    assert sum(result.outcomes.values()) == 80
    assert result.outcomes["Succeeded"] >= 40, result.summary()  # faults, not a wall
    assert result.replay_exit == 0
    # Everything was actually injected.
    for fault in ("error 500", "error 429", "error 409", "watch drop"):
        assert result.sim_faults[fault] > 0, fault
    for fault in ("503", "tag vanished", "403 delete", "slow blob"):
        assert result.registry_faults[fault] > 0, fault
    assert result.node_failures > 0
    # Gate 7: the persistent GC refusal is visible three ways, never a clean success.
    gc = result.gc_refusals_visible
    assert gc["phase"] > 0, result.summary()
    assert gc["condition"] == gc["phase"]
    assert gc["warning_events"] >= gc["phase"]
    assert gc["metric"] >= gc["phase"]
    # Secrets: the registry password and the API token are nowhere.
    assert result.secret_leaks == []
