"""The summary page's SVG bar charts (``controlplane.api.charts``) and the builders that
turn reporting rows into them (``controlplane.api.summary_charts``), without a database:
bars are proportional to their values, text is escaped, an empty chart says so, every
chart is well-formed XML with a title and description a screen reader reads."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta, timezone

import pytest

from controlplane.api.charts import BarChart, Series, render, seconds, size, ticks
from controlplane.api.summary_charts import (
    bytes_by_class,
    drain_load,
    durations_by_kind,
    durations_by_phase,
    failures_by_reason,
    hour_of,
    operations_per_hour,
    percentile,
)

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def bars(root: ET.Element) -> list[ET.Element]:
    return [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]


def chart(**kw: object) -> BarChart:
    base: dict[str, object] = {
        "name": "c", "title": "T", "description": "D", "groups": ("a", "b", "c"),
        "series": (Series("n", (1.0, 2.0, 4.0)),)}
    base.update(kw)
    return BarChart(**base)  # type: ignore[arg-type]


def test_bar_lengths_are_proportional_to_values() -> None:
    root = parse(render(chart()))
    widths = [float(b.get("width", "")) for b in bars(root)]
    assert len(widths) == 3
    assert widths[1] == pytest.approx(2 * widths[0])
    assert widths[2] == pytest.approx(4 * widths[0])
    assert [b.get("data-value") for b in bars(root)] == ["1", "2", "4"]


def test_stacked_segments_follow_each_other_and_the_stack_is_their_sum() -> None:
    root = parse(render(chart(stacked=True, groups=("x",),
                              series=(Series("p", (3.0,)), Series("q", (1.0,))))))
    first, second = bars(root)
    assert float(second.get("x", "")) == pytest.approx(
        float(first.get("x", "")) + float(first.get("width", "")))
    assert float(first.get("width", "")) == pytest.approx(3 * float(second.get("width", "")))
    assert first.get("y") == second.get("y")


def test_grouped_bars_of_one_group_sit_on_separate_rows() -> None:
    root = parse(render(chart(groups=("x",), series=(Series("p50", (1.0,)),
                                                     Series("p95", (3.0,))))))
    first, second = bars(root)
    assert first.get("x") == second.get("x")
    assert first.get("y") != second.get("y")


def test_text_is_escaped() -> None:
    nasty = '<script>alert("x")</script>&'
    svg = render(chart(title=nasty, description=nasty, groups=(nasty, "b", "c"),
                       series=(Series(nasty, (1.0, 2.0, 3.0)),)))
    assert "<script" not in svg
    root = parse(svg)  # well-formed: nothing broke out of its element or attribute
    assert root.find(f"{SVG}title") is not None
    assert root.find(f"{SVG}title").text == nasty  # type: ignore[union-attr]
    assert bars(root)[0].get("data-series") == nasty


def test_the_chart_is_an_accessible_image() -> None:
    root = parse(render(chart()))
    assert root.get("role") == "img"
    assert root.get("aria-labelledby") == "c-title c-desc"
    assert root.find(f"{SVG}title").get("id") == "c-title"  # type: ignore[union-attr]
    desc = root.find(f"{SVG}desc")
    assert desc is not None
    assert desc.get("id") == "c-desc"
    assert "a: n 1" in (desc.text or "")  # the values, in words


def test_series_differ_by_pattern_and_legend_not_only_colour() -> None:
    root = parse(render(chart(groups=("x",), series=(Series("p", (1.0,)),
                                                     Series("q", (2.0,))))))
    patterns = list(root.iter(f"{SVG}pattern"))
    assert [p.get("id") for p in patterns] == ["c-p0", "c-p1"]
    assert len(list(patterns[1])) > len(list(patterns[0]))  # an overlay on the second
    assert [b.get("fill") for b in bars(root)] == ["url(#c-p0)", "url(#c-p1)"]
    legend = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "legend")
    assert [t.text for t in legend.iter(f"{SVG}text")] == ["p", "q"]


@pytest.mark.parametrize("empty", [
    {"groups": (), "series": (Series("n", ()),)},
    {"groups": ("a",), "series": ()},
    {"groups": ("a",), "series": (Series("n", (0.0,)),)},
])
def test_empty_data_says_no_data_instead_of_drawing_bars(empty: dict[str, object]) -> None:
    root = parse(render(chart(**empty)))
    assert bars(root) == []
    assert "empty" in (root.get("class") or "")
    assert "no data yet" in [t.text for t in root.iter(f"{SVG}text")]
    assert root.find(f"{SVG}title").text == "T"  # type: ignore[union-attr]


def test_a_bad_name_colour_or_series_length_is_refused() -> None:
    with pytest.raises(ValueError, match="chart name"):
        chart(name='x" onload="')
    with pytest.raises(ValueError, match="colour"):
        chart(series=(Series("n", (1.0, 2.0, 3.0), colour="red"),))
    with pytest.raises(ValueError, match="2 values for 3 groups"):
        chart(series=(Series("n", (1.0, 2.0)),))


def test_axis_ticks_are_round_and_cover_the_highest_value() -> None:
    assert ticks(4) == [0, 1, 2, 3, 4]
    assert ticks(7.3) == [0, 2, 4, 6, 8]
    assert ticks(0) == [0, 1]
    assert ticks(1234)[-1] >= 1234
    assert ticks(1, whole=True) == [0, 1]
    assert size(3 * 1024 * 1024) == "3.0 MiB"
    assert [seconds(v) for v in (0, 0.012, 4.5, 300)] == ["0 s", "12 ms", "4.50 s",
                                                          "5.0 min"]


def axis_labels(svg: str) -> list[str | None]:
    axis = next(g for g in parse(svg).iter(f"{SVG}g") if g.get("class") == "axis")
    return [t.text for t in axis.iter(f"{SVG}text")]


def test_axis_labels_are_round_in_the_unit_shown() -> None:
    assert axis_labels(render(chart(groups=("x",), series=(Series("n", (1.0,)),)))) == [
        "0", "1"]  # a count has no quarter steps
    assert axis_labels(render(chart(groups=("x",), unit=size,
                                    series=(Series("n", (50 * 1024.0,)),)))) == [
        "0 B", "20.0 KiB", "40.0 KiB", "60.0 KiB"]


def test_percentile_interpolates_between_ranks_as_cpctl_report() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)
    assert percentile([0.0, 10.0], 0.95) == pytest.approx(9.5)
    assert percentile([7.0], 0.95) == 7.0


def test_hour_is_utc_whatever_the_driver_returns() -> None:
    plus2 = timezone(timedelta(hours=2))
    assert hour_of(datetime(2026, 11, 25, 12, 30, tzinfo=plus2)) == "2026-11-25 10:00"
    assert hour_of("2026-11-25 10:59:47.123456") == "2026-11-25 10:00"


def test_operations_per_hour_stack_by_outcome_over_the_last_day_quiet_hours_too() -> None:
    t = datetime(2026, 11, 25, 10, 5, tzinfo=UTC)
    built = operations_per_hour([
        {"submitted_at": t, "outcome": "Succeeded", "terminal": True},
        {"submitted_at": t, "outcome": "Suspended", "terminal": True},
        {"submitted_at": t + timedelta(hours=2), "outcome": "Failed", "terminal": True},
        {"submitted_at": t + timedelta(hours=2), "outcome": "Restoring", "terminal": False},
        {"submitted_at": t - timedelta(days=2), "outcome": "Failed", "terminal": True},
    ], now=t + timedelta(hours=3))
    assert built.groups == ("2026-11-25 10:00", "2026-11-25 11:00", "2026-11-25 12:00",
                            "2026-11-25 13:00")
    assert {s.name: s.values for s in built.series} == {
        "succeeded": (2.0, 0.0, 0.0, 0.0), "failed": (0.0, 0.0, 1.0, 0.0),
        "running": (0.0, 0.0, 1.0, 0.0)}
    assert built.stacked
    assert "no data yet" in render(operations_per_hour([], now=t))


def test_durations_show_p50_and_p95_per_kind_and_per_phase_in_phase_order() -> None:
    by_kind = durations_by_kind([("migration", 1.0), ("migration", 3.0), ("checkpoint", 2.0)])
    assert by_kind.groups == ("checkpoint", "migration")
    assert [s.name for s in by_kind.series] == ["p50", "p95"]
    assert by_kind.series[0].values == (2.0, 2.0)
    phases = {f"{p}_seconds": None for p in ("queued", "checkpoint", "delete", "restore", "gc")}
    by_phase = durations_by_phase([{**phases, "restore_seconds": 4, "queued_seconds": 1}])
    assert by_phase.groups == ("queued", "restore")  # phases with data, in their order
    assert by_phase.series[1].values == (1.0, 4.0)


def test_bytes_failures_and_drain_load_from_their_rows() -> None:
    assert bytes_by_class([{"class_name": "gold", "bytes": 10},
                           {"class_name": "default", "bytes": None}]).series[0].values == (
        0.0, 10.0)
    failed = failures_by_reason([{"reason": "CaptureFailed", "kind": "migration",
                                  "operations": 2},
                                 {"reason": None, "kind": "checkpoint", "operations": 1}])
    assert failed.groups == ("(none)", "CaptureFailed")
    assert {s.name: s.values for s in failed.series} == {
        "checkpoint": (1.0, 0.0), "migration": (0.0, 2.0)}
    load = drain_load({"drain_id": "0123456789", "node": "node-1"}, [
        {"target": "node-2", "outcome": "Succeeded"}, {"target": "node-2", "outcome": None},
        {"target": None, "outcome": "Refused"}])
    assert load.title == "Per-node load of a drain (drain 01234567 of node-1)"
    assert load.groups == ("-", "node-2")
    assert {s.name: s.values for s in load.series} == {
        "succeeded": (0.0, 1.0), "failed": (1.0, 0.0), "running": (0.0, 1.0)}
    assert "no data yet" in render(drain_load(None, []))
