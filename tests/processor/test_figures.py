"""Scenarios for processor/figures.py: the figures both reports draw (polar-process's report.html, polar-train's).

1.x  curves: a flat series' axis, a varying one's span, what a chart leaves out, one polyline per drawn series
2.x  histograms: a value repeated, counts that add up
"""

from __future__ import annotations

import re

import pytest

from polar.processor.figures import flat_range, line_chart, value_histogram, y_range

pytestmark = pytest.mark.unit

H, PAD = 220, 36  # line_chart's default height and padding


def y_labels(svg: str) -> list[str]:
    """The y axis' labels (top, bottom): line_chart's only end-anchored texts."""
    return re.findall(r'text-anchor="end">([^<]*)</text>', svg)


def dot_ys(svg: str) -> list[float]:
    return [float(y) for y in re.findall(r'<circle cx="[^"]*" cy="([^"]*)"', svg)]


@pytest.mark.parametrize("value,labels,where", [
    (0.0, ["1", "0"], H - PAD),             # a count that stays 0 sits on the axis, under 0…1
    (0.45, ["0.9", "0"], H / 2),            # a rate that stays 0.45: 0…0.9, the line in the middle
    (4, ["8", "0"], H / 2),                 # updates per step, always 4
    (-0.2, ["0", "-0.4"], H / 2),           # a loss that stays −0.2: −0.4…0
], ids=["zero", "rate", "count", "negative"])
def test_1_1_a_flat_series_gets_an_axis_through_zero_not_minus_half_to_half(value, labels, where):
    svg = line_chart("flat", [("v", [(1, value), (2, value), (3, value)])])
    assert y_labels(svg) == labels
    assert "-0.5" not in y_labels(svg) and "0.5" not in y_labels(svg)
    assert dot_ys(svg) == [pytest.approx(where, abs=0.1)] * 3


def test_1_2_a_varying_series_keeps_its_span_however_small():
    assert y_range([1.0, 1.0 + 1e-9, 1.0]) == (1.0, 1.0 + 1e-9)
    assert y_range([0.2, 0.5, 0.4]) == (0.2, 0.5)
    assert y_range([3.0, 3.0]) == flat_range(3.0) == (0.0, 6.0)
    svg = line_chart("ratio", [("mean", [(1, 1.0), (2, 1.000001)])])
    assert y_labels(svg) == ["1.000001", "1"]  # a ratio near 1 still shows its spread
    assert sorted(dot_ys(svg)) == [pytest.approx(PAD), pytest.approx(H - PAD)]


def test_1_3_points_without_a_finite_number_are_left_out_and_an_empty_chart_says_so():
    svg = line_chart("mixed", [("alpha", [(1, 0.1), (2, None), (3, float("nan")), (4, True), (5, 0.3)]),
                               ("beta", [(1, None)]), ("gamma", [(2, 0.2), (3, 0.25)])])
    assert svg.count("<polyline") == 2 and len(dot_ys(svg)) == 4  # alpha: steps 1 and 5; gamma: steps 2 and 3
    assert "step 5: 0.3" in svg and "step 4" not in svg
    legend = re.search(r'<div class="legend">(.*?)</div>', svg)[1]
    assert re.findall(r"</span> (\w+)", legend) == ["alpha", "gamma"]  # only the series drawn
    assert "no value yet" in line_chart("none", [("a", [(1, None)])])
    assert "legend" not in line_chart("unnamed", [("", [(1, 1.0), (2, 2.0)])])


def test_1_4_labels_are_escaped():
    svg = line_chart("<b>title</b>", [("<i>x</i>", [(1, 1.0), (2, 2.0)])])
    assert "<b>" not in svg and "<i>" not in svg and "&lt;b&gt;title" in svg


def test_2_1_a_repeated_value_is_one_bar_and_counts_add_up():
    one = value_histogram([0.25] * 7, "gaps", "nats")
    assert re.findall(r"<title>([^<]*)</title>", one) == ["0.25: 7"]
    many = value_histogram([0.0, 0.1, 0.2, 0.2, None, float("inf"), 1.0], "gaps", "nats", bins=4)
    counts = [int(t.rsplit(": ", 1)[1]) for t in re.findall(r"<title>([^<]*)</title>", many)]
    assert counts == [4, 0, 0, 1]  # 0.0…0.2 in the first quarter, 1.0 in the last; None and inf left out
    assert "no data" in value_histogram([None, float("nan")], "gaps", "nats")
