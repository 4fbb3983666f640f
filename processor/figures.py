"""The reports' figures: one function per kind of figure, each returning a self-contained `<figure>` of inline SVG
(no script, no external resource; every label escaped). polar-process's report.html and polar-train's report.html
draw with these same functions, so a curve or a histogram is drawn one way wherever it appears.

Standard library only: polar.trainer.report imports it without the processor's dependencies."""

from __future__ import annotations

import bisect
import html
import math

__all__ = ["axes", "dot_columns", "figure", "flat_range", "fmt", "hbars", "integer_bins", "length_histogram",
           "line_chart", "value_histogram", "y_range"]

BLUE, RED, GREY = "#4a7bd0", "#d0493f", "#9aa3b5"
SERIES_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
FLAT = 1e-12  # a series whose values span less than this is flat: it gets flat_range's axis

def fmt(x: float | None) -> str:
    """A number for a label or a table cell: three significant digits, "–" for none."""
    return "–" if x is None else f"{x:.3g}"


def figure(title: str, w: float, h: float, body: str, after: str = "") -> str:
    """A captioned SVG of w × h holding `body` (SVG elements); `after`: HTML under the drawing (a legend)."""
    return (f'<figure><figcaption>{html.escape(title)}</figcaption><svg xmlns="http://www.w3.org/2000/svg" '
            f'width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">{body}</svg>{after}</figure>')


def _text(x: float, y: float, text: object, anchor: str = "start") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="11" fill="#444" text-anchor="{anchor}">'
            f"{html.escape(str(text))}</text>")


def axes(w: float, h: float, pad: float, lo: object, hi: object, xlabel: str, top: object, left: float | None = None,
         bottom: object = None) -> str:
    """The x axis with its end labels and name, the top (and optionally bottom) value on the left."""
    left = pad if left is None else left
    out = (f'<line x1="{left}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#333"/>'
           + _text(left, h - pad + 16, lo) + _text(w - pad, h - pad + 16, hi, "end")
           + _text((left + w - pad) / 2, h - 6, xlabel, "middle") + _text(left - 4, pad, top, "end"))
    if bottom is not None:
        out += _text(left - 4, h - pad, bottom, "end")
    return out


# ---------------------------------------------------------------------------------------------------- histograms

def integer_bins(lo: int, hi: int, n: int = 30) -> list[tuple[int, int]]:
    """At most n bins of whole numbers covering lo..hi, log-spaced (lengths span orders of magnitude): each
    (first, last) inclusive, the next starting at last + 1, so bins never overlap and no two labels are alike."""
    base = max(lo, 1)  # 0 gets a bin of its own
    m = n - 1 if lo < base else n
    edges = {base, hi + 1, *(round(base * ((hi + 1) / base) ** (i / m)) for i in range(1, m))}
    if lo < base:
        edges.add(lo)
    cuts = sorted(e for e in edges if lo <= e <= hi + 1)
    return [(a, b - 1) for a, b in zip(cuts, cuts[1:])]


def _bars(counts: list[int], labels: list[str], w: float, h: float, pad: float) -> str:
    top, bw = max(counts), (w - 2 * pad) / len(counts)
    out = []
    for i, (n, label) in enumerate(zip(counts, labels)):
        bh = (h - 2 * pad) * n / top if top else 0
        out.append(f'<rect x="{pad + i * bw:.1f}" y="{h - pad - bh:.1f}" width="{max(bw - 1, 1):.1f}" '
                   f'height="{bh:.1f}" fill="{BLUE}"><title>{html.escape(label)}: {n}</title></rect>')
    return "".join(out)


def length_histogram(values: list[int], title: str, xlabel: str, bins: int = 30) -> str:
    """Counts of whole numbers in `integer_bins`; each bar's title is its range and count."""
    if not values:
        return f"<p>{html.escape(title)}: no data</p>"
    w, h, pad = 640, 220, 40
    lo, hi = min(values), max(values)
    ranges = integer_bins(lo, hi, bins)
    starts = [a for a, _ in ranges]
    counts = [0] * len(ranges)
    for v in values:
        counts[bisect.bisect_right(starts, v) - 1] += 1
    labels = [f"{a}{'' if a == b else f'–{b}'}" for a, b in ranges]
    return figure(title, w, h, _bars(counts, labels, w, h, pad) + axes(w, h, pad, lo, hi, xlabel, max(counts)))


def value_histogram(values: list[float | None], title: str, xlabel: str, bins: int = 20) -> str:
    """Counts of real numbers in equal-width bins (one bin when every value is the same)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return f"<p>{html.escape(title)}: no data</p>"
    w, h, pad = 480, 200, 36
    lo, hi = min(vals), max(vals)
    n = 1 if hi == lo else bins
    width = (hi - lo) / n if n > 1 else 1.0
    counts = [0] * n
    for v in vals:
        counts[min(n - 1, int((v - lo) / width)) if n > 1 else 0] += 1
    labels = [f"{lo:.3g}" if n == 1 else f"{lo + i * width:.3g}–{lo + (i + 1) * width:.3g}" for i in range(n)]
    return figure(title, w, h, _bars(counts, labels, w, h, pad)
                  + axes(w, h, pad, f"{lo:.3g}", f"{hi:.3g}", xlabel, max(counts)))


# ---------------------------------------------------------------------------------------------------- bars and dots

def hbars(items: list[tuple[str, int]], title: str, color: str = "#d07b4a") -> str:
    """One horizontal bar per (name, count), the count written at its end."""
    if not items:
        return f"<p>{html.escape(title)}: none</p>"
    w, row, left = 480, 22, 150
    top = max(v for _, v in items) or 1
    bars = []
    for i, (name, v) in enumerate(items):
        bw = (w - left - 60) * v / top
        y = 5 + i * row
        bars.append(f'<text x="{left - 6}" y="{y + 15}" font-size="12" text-anchor="end">{html.escape(name)}</text>'
                    f'<rect x="{left}" y="{y + 3}" width="{max(bw, 1 if v else 0):.1f}" height="{row - 6}" '
                    f'fill="{color}"><title>{html.escape(name)}: {v}</title></rect>'
                    f'<text x="{left + bw + 4:.1f}" y="{y + 15}" font-size="12">{v:,}</text>')
    return figure(title, w, row * len(items) + 10, "".join(bars))


def dot_columns(columns: list[tuple[str, list[float], float]], title: str, xlabel: str) -> str:
    """One column per (tooltip, values, mean): the values as dots on a vertical range, the mean as a red bar."""
    if not columns:
        return f"<p>{html.escape(title)}: no data</p>"
    w, h, pad = 720, 220, 40
    lo, hi = y_range([v for _, vs, _ in columns for v in vs])
    y = lambda r: h - pad - (h - 2 * pad) * (r - lo) / (hi - lo)  # noqa: E731
    step = (w - 2 * pad) / len(columns)
    parts = []
    for i, (tip, vs, mean) in enumerate(columns):
        x = pad + (i + 0.5) * step
        dots = "".join(f'<circle cx="{x:.1f}" cy="{y(v):.1f}" r="3" fill="{BLUE}" fill-opacity="0.6"/>' for v in vs)
        parts.append(f'<g><title>{html.escape(tip)}</title>'
                     f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y(min(vs)):.1f}" y2="{y(max(vs)):.1f}" stroke="{GREY}"/>'
                     f'{dots}<line x1="{x - step / 3:.1f}" x2="{x + step / 3:.1f}" y1="{y(mean):.1f}" '
                     f'y2="{y(mean):.1f}" stroke="{RED}" stroke-width="2"/></g>')
    return figure(title, w, h, "".join(parts) + axes(w, h, pad, "", "", xlabel, f"{hi:.3g}", bottom=f"{lo:.3g}"))


# ---------------------------------------------------------------------------------------------------- curves

def flat_range(v: float) -> tuple[float, float]:
    """The y axis of a flat series at v: from 0 to 2v, so that zero is on the axis and v in the middle (a rate that
    stays at 0.45 reads as 0.45 out of 0.9, not as noise); 0…1 when v is 0 (a count that stays 0 sits on the
    axis, not in the middle of −0.5…0.5)."""
    if v == 0:
        return 0.0, 1.0
    return min(0.0, 2 * v), max(0.0, 2 * v)


def y_range(ys: list[float]) -> tuple[float, float]:
    """The y axis of a curve: its values' span, or `flat_range` when the values are all (nearly) the same."""
    lo, hi = min(ys), max(ys)
    return (lo, hi) if hi - lo >= FLAT else flat_range(lo)


def _x_ticks(xs: list[float], most: int = 12) -> list[float]:
    """Every x when there are few, else about ten evenly picked and the last."""
    xs = sorted(set(xs))
    if len(xs) <= most:
        return xs
    every = math.ceil(len(xs) / 10)
    return sorted(set(xs[::every]) | {xs[-1]})


def _finite(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(x, float(y)) for x, y in points if isinstance(y, (int, float)) and not isinstance(y, bool)
            and math.isfinite(y)]


def line_chart(title: str, series: list[tuple[str, list[tuple[float, float]]]], xlabel: str = "step",
               w: int = 440, h: int = 220) -> str:
    """One curve per (legend, [(x, y), ...]) on shared axes, a dot per point whose title is `step x: y`; a legend
    when a series has a name. Points whose y is not a finite number are left out; a chart with no point says so.
    A flat chart gets `flat_range`'s axis."""
    series = [(name, _finite(points)) for name, points in series]
    pts = [p for _, s in series for p in s]
    if not pts:
        return (f'<figure><figcaption>{html.escape(title)}</figcaption><p class="none">no value yet</p>'
                "</figure>")
    pad, left = 36, 72  # left: room for the y labels
    xs = [x for x, _ in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range([y for _, y in pts])
    sx = lambda x: left + (w - left - pad) * ((x - x0) / (x1 - x0) if x1 > x0 else 0.5)  # noqa: E731
    sy = lambda y: h - pad - (h - 2 * pad) * (y - y0) / (y1 - y0)  # noqa: E731
    digits = 4 if (y1 - y0) > 1e-3 * max(abs(y0), abs(y1)) else 8  # a ratio near 1 still shows its spread
    parts = [f'<line x1="{left}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#888"/>',
             f'<line x1="{left}" y1="{pad}" x2="{left}" y2="{h - pad}" stroke="#888"/>',
             _text(left - 4, sy(y1) + 4, f"{y1:.{digits}g}", "end"),
             _text(left - 4, sy(y0) + 4, f"{y0:.{digits}g}", "end"),
             _text((left + w - pad) / 2, h - 4, xlabel, "middle")]
    parts += [_text(sx(x), h - pad + 14, f"{x:g}", "middle") for x in _x_ticks(xs)]
    legend = []
    for i, (name, s) in enumerate(series):
        if not s:
            continue
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"><title>step {x:g}: {y:.6g}'
                  "</title></circle>" for x, y in s]
        if name:
            legend.append(f'<span style="color:{color}">■</span> {html.escape(name)}')
    return figure(title, w, h, "".join(parts), f'<div class="legend">{" ".join(legend)}</div>' if legend else "")
