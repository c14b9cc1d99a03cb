"""The cyclic collector: services run with a larger young generation, bulk folds without it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from controlplane.gc_tuning import SERVICE_THRESHOLDS, collector_paused, tune_for_service


@pytest.fixture(autouse=True)
def _restore_collector() -> Iterator[None]:
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


def test_a_service_collects_cycles_less_often_but_still_collects_them() -> None:
    tune_for_service()
    assert gc.get_threshold() == SERVICE_THRESHOLDS
    assert gc.get_threshold()[0] > 700
    assert gc.isenabled()


def _failing_fold(seen: list[bool]) -> None:
    with collector_paused():
        seen.append(gc.isenabled())
        raise RuntimeError("fold failed")


def test_a_paused_collector_is_enabled_again_even_when_the_work_fails() -> None:
    gc.enable()
    seen: list[bool] = []
    with pytest.raises(RuntimeError):
        _failing_fold(seen)
    assert seen == [False]
    assert gc.isenabled()


def test_pausing_leaves_an_already_disabled_collector_disabled() -> None:
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
