"""What the agent answers a migration mode with: ``criu check``'s word on the kernel's
dirty-page tracking, read into a refusal that names the feature."""

from __future__ import annotations

from drivers.agent.modes import dirty_tracking_refusal

OFF = "Warn  (criu/cr-check.c:824): Dirty tracking is OFF. Memory snapshot will not work.\n"


def test_a_kernel_without_dirty_tracking_is_named_in_the_refusal() -> None:
    why = dirty_tracking_refusal(1, OFF)
    assert why is not None
    assert "CONFIG_MEM_SOFT_DIRTY" in why
    assert "Dirty tracking is OFF. Memory snapshot will not work." in why
    assert "cr-check.c" not in why  # CRIU's source location is not the operator's business


def test_a_kernel_that_tracks_dirty_pages_is_no_refusal() -> None:
    assert dirty_tracking_refusal(0, "") is None


def test_a_silent_failure_still_says_how_criu_ended() -> None:
    assert "exit 2" in (dirty_tracking_refusal(2, "") or "")
