"""Crash campaign (CI size): 100 migrations, 3 ``cpctl worker`` processes on PostgreSQL,
a chaos task SIGKILLing each worker 0.3-1.5 s after it has started working and starting
it again.

Invariants, all read from evidence (:mod:`tests.reliability.campaign`): every operation
terminal; every history gap-free; no source pod deleted (simulator's deletion log) before
its migration verified the artifact; no artifact dropped before a verified restore, and
the registry holds exactly the artifacts the histories did not collect; each workload
marker carried by exactly one Running pod (nothing lost, nothing duplicated);
``cpctl replay --verify`` exits 0. ``make soak`` runs the same driver with 5,000 (100
here, with shorter lives: the suite's time is shared).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.campaign import Campaign, CampaignConfig, history_violations

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.mark.timeout(900)  # a hang guard: 320 s in a loaded suite on a slow host
async def test_100_migrations_survive_random_sigkills_of_three_workers(tmp_path: Path) -> None:
    result = await Campaign(CampaignConfig(migrations=100, workers=3, seed=8,
                                           worker_life=(0.3, 1.5)), tmp_path).run()
    print(result.summary())  # the campaign's figures, in the test log (-s / on failure)
    assert not result.violations, result.summary()
    assert sum(result.outcomes.values()) == 100
    assert result.outcomes["Succeeded"] == 100, result.summary()
    assert result.kills >= 6, result.summary()  # two lives cut short per worker at least
    # Kills landed between a commit and its actions: the next owner performed them.
    assert result.takeovers >= 1, result.summary()
    assert result.replay_exit == 0


def test_the_history_checker_catches_each_broken_promise() -> None:
    """The campaign's checker is not vacuous: each unsafe order is reported."""
    ok = [(1, "Submitted"), (2, "ArtifactVerified"), (3, "SourceDeletionRequested"),
          (4, "RestoreVerified"), (5, "ArtifactDeletionRequested"), (6, "ArtifactDeleted")]
    assert history_violations("m", "migration", "Succeeded", True, ok) == []
    early_delete = [(1, "Submitted"), (2, "SourceDeletionRequested"), (3, "ArtifactVerified")]
    early_gc = [(1, "Submitted"), (2, "ArtifactDeletionRequested"), (3, "RestoreVerified")]
    gap = [(1, "Submitted"), (3, "ArtifactVerified")]
    assert "before ArtifactVerified" in history_violations(
        "m", "migration", "Failed", True, early_delete)[0]
    assert "before RestoreVerified" in history_violations(
        "m", "migration", "Failed", True, early_gc)[0]
    assert "gap" in history_violations("m", "migration", "Failed", True, gap)[0]
    assert "non-terminal" in history_violations("m", "migration", "Restoring", False, ok)[0]
    assert "without its artifact collected" in history_violations(
        "m", "migration", "Succeeded", True, ok[:5])[0]
