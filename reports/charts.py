"""Inline SVG charts of a release's guarantees, drawn from the project's privacy calculus.

Every number plotted comes from :mod:`privrelease.mechanisms` (never typed in):

* :func:`sdgs_charts` — delta against epsilon for each (k, beta) of the release's SDGS and
  crowd-blending histogram releases, on a log10 axis: Theorem 1's d(k, beta, eps) (Li, Qardaji,
  Su; only for eps >= -ln(1 - beta)) from :func:`~privrelease.mechanisms.sdgs_math.theorem1_grid`
  and the exact hockey-stick delta from :func:`~privrelease.mechanisms.sdgs_math.exact_grid`,
  with each release's epsilon marked.
* :func:`fsmooth_chart` — the f-smooth curve delta0 f(x) at epsilon = x eps0 (Theorem 6) of the
  release's SDGS releases composed by Theorem 5 (:func:`~privrelease.mechanisms.accountants.fsmooth`).
* :func:`ledger_chart` — the dataset's lifetime privacy curve: delta against epsilon of every
  counting release composed before and after this one
  (:func:`~privrelease.audit.ledger.history_curve`), with the lifetime budget marked.
* :func:`frontier_charts` — for each mechanism whose kind has a tunable parameter, its
  privacy-accuracy frontier (:meth:`~privrelease.mechanisms.kinds.MechanismKind.frontier`):
  epsilon at the target delta and the kind's accuracy over the parameter, the policy's value
  marked, in two panels sharing the x axis.
* :func:`splu_charts` — SPLU-Gen's probability that a true count f = 1..30 is estimated with a
  relative error above eps (Fu et al., Lemma 2, Fig. 5;
  :func:`~privrelease.mechanisms.splu_guarantees.privacy_curve`).

The SVG is hand-written (no JavaScript, no external resources, no xmlns URL needed inline in
HTML), every text escaped, each chart titled (``<title>``, ``aria-label``) with a table of the
plotted values beside it. Each release's point carries its exact values as ``data-*``
attributes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from markupsafe import Markup, escape

from privrelease.mechanisms import accountants, splu_guarantees
from privrelease.mechanisms.events import SDGS, Composed, SPLUGen, leaves
from privrelease.mechanisms.kinds import Frontier
from privrelease.mechanisms.sdgs_math import (
    SdgsDelta,
    exact_grid,
    fsmooth_delta,
    min_theorem1_epsilon,
    theorem1_grid,
)
from privrelease.planning import Plan

PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")
"""Okabe-Ito colours (readable with colour-vision deficiencies); dash patterns differ too."""
GREY = "#666666"
SPLU_F_MAX = 30
"""True counts f = 1..SPLU_F_MAX are charted (more when the policy's alpha is larger)."""
SPLU_DEFAULT_EPS = 0.3
"""Relative error charted when the policy has no splu_privacy target (Fu et al., Examples 1-2)."""
LOG10_FLOOR = -300.0
"""The lowest decade a log axis shows."""

WIDTH, LEFT, RIGHT, TOP, PLOT_HEIGHT, BOTTOM, LEGEND_ROW = 660, 76, 22, 30, 250, 48, 19


@dataclass(frozen=True)
class Chart:
    """One chart: the SVG, what it shows in words, and the plotted values as a table."""

    id: str
    title: str
    caption: str
    svg: Markup
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Series:
    """A curve: ``points`` are (x, y) in axis units (y in decades on a log axis); y None is a
    gap (the curve is not defined there)."""

    label: str
    points: Sequence[tuple[float, float | None]]
    color: str
    dash: str = ""
    line: bool = True
    dots: bool = False


@dataclass(frozen=True)
class Point:
    """A highlighted point with a tooltip and its exact values as ``data-*`` attributes."""

    x: float
    y: float
    color: str
    tooltip: str
    data: dict[str, float | str] = field(default_factory=dict)
    legend: str = ""
    """Legend text (points with the same text share one legend entry)."""


@dataclass(frozen=True)
class Rule:
    """A vertical (``axis='x'``) or horizontal (``axis='y'``) reference line at ``at``."""

    axis: str
    at: float
    label: str
    color: str = GREY
    dash: str = "5 4"


# --- number formatting ---------------------------------------------------------------------


def fmt(value: float | None, digits: int = 6) -> str:
    """A number for people: ``digits`` significant digits, "n/a" for None, "∞" for inf."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return f"{float(value):.{digits}g}"


def fmt_delta(result: SdgsDelta, digits: int = 6) -> str:
    """An SDGS delta, exact below the smallest double too (from its log10)."""
    if result.delta is None or result.log10_delta is None:
        return "n/a"
    if result.log10_delta == -math.inf:
        return "0"
    if result.delta >= 1e-300:
        return fmt(result.delta, digits)
    exponent = math.floor(result.log10_delta)
    return f"{10 ** (result.log10_delta - exponent):.{digits - 1}f}e{exponent}"


def _num(value: float) -> str:
    """A coordinate in the SVG."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


# --- ticks ---------------------------------------------------------------------------------


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10 times a power of ten >= value."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * power >= value * (1 - 1e-12):
            return float(f"{step * power:.12g}")
    return 10 * power


def linear_ticks(low: float, high: float, target: int = 6) -> list[float]:
    """Round tick positions covering [low, high]: multiples of 1, 2, 2.5 or 5 times 10^n."""
    span = high - low
    raw = span / target
    power = 10 ** math.floor(math.log10(raw))
    step = next(s * power for s in (1, 2, 2.5, 5, 10) if s * power >= raw)
    first = math.ceil(low / step - 1e-9)
    return [round(i * step, 10) for i in range(first, math.floor(high / step + 1e-9) + 1)]


def decade_step(low: float, high: float, most: int = 7) -> int:
    """1, 2, 5, 10, 20, 50 or 100 decades: the smallest giving at most ``most`` ticks."""
    span = high - low
    return next((s for s in (1, 2, 5, 10, 20, 50) if span / s <= most - 1), 100)


def snap_decades(low: float, high: float) -> tuple[float, float]:
    """[low, high] widened to multiples of the tick step, so both ends carry a label."""
    step = decade_step(low, high)
    return float(math.floor(low / step) * step), float(math.ceil(high / step) * step)


def decade_ticks(low: float, high: float, most: int = 7) -> list[float]:
    """Integer decades in [low, high] spaced by :func:`decade_step`."""
    step = decade_step(low, high, most)
    return [float(d) for d in range(math.ceil(low / step) * step, math.floor(high) + 1, step)]


def log_ticks(low: float, high: float) -> list[tuple[float, float]]:
    """(log10 position, value) of the values 1, 2 and 5 times a power of ten between the
    decades ``low`` and ``high``."""
    ticks = []
    for decade in range(math.floor(low), math.ceil(high) + 1):
        for step in (1, 2, 5):
            value = float(f"{step * 10.0**decade:.12g}")
            if low - 1e-9 <= math.log10(value) <= high + 1e-9:
                ticks.append((math.log10(value), value))
    return ticks


def _decade_label(decade: float) -> str:
    exponent = int(decade)
    if exponent == 0:
        return "1"
    return f'10<tspan dy="-6" font-size="9">{exponent}</tspan>'


def _tick_label(value: float) -> str:
    return f"{value:g}"


# --- drawing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Frame:
    x_range: tuple[float, float]
    y_range: tuple[float, float]

    def px(self, x: float) -> float:
        low, high = self.x_range
        return LEFT + (x - low) / (high - low) * (WIDTH - LEFT - RIGHT)

    def py(self, y: float) -> float:
        low, high = self.y_range
        y = min(max(y, low), high)
        return TOP + (high - y) / (high - low) * PLOT_HEIGHT


def _path(frame: _Frame, points: Sequence[tuple[float, float | None]]) -> str:
    """An SVG path, broken where y is None."""
    parts, pen_down = [], False
    for x, y in points:
        if y is None or not math.isfinite(x):
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{_num(frame.px(x))} {_num(frame.py(y))}")
        pen_down = True
    return " ".join(parts)


def plot(
    *,
    chart_id: str,
    title: str,
    description: str,
    x_label: str,
    y_label: str,
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    log_y: bool,
    series: Sequence[Series],
    points: Sequence[Point] = (),
    rules: Sequence[Rule] = (),
    band: tuple[float, float, str] | None = None,
    log_x: bool = False,
) -> Markup:
    """One self-contained SVG chart: axes with ticks and labels, grid, curves, reference lines,
    highlighted points and a legend below the plot. ``log_y``: y values are log10 (decades);
    ``log_x``: x values are log10, ticked at 1, 2 and 5 times a power of ten.
    ``band``: (x_low, x_high, label) shaded."""
    if log_y:
        y_range = snap_decades(*y_range)
    frame = _Frame(x_range, y_range)
    legend_items = [(s.label, s.color, s.dash, s.line, s.dots) for s in series]
    legend_items += [(r.label, r.color, r.dash, True, False) for r in rules if r.label]
    for label, color in dict.fromkeys((p.legend, p.color) for p in points if p.legend):
        legend_items.append((label, color, "", False, True))
    height = TOP + PLOT_HEIGHT + BOTTOM + LEGEND_ROW * (len(legend_items) + (band is not None)) + 6
    e = escape
    out: list[str] = [
        (
            f'<svg class="chart" id="{e(chart_id)}" role="img" aria-label="{e(title)}" '
            f'aria-describedby="{e(chart_id)}-desc" viewBox="0 0 {WIDTH} {height}" '
            f'width="{WIDTH}" height="{height}" font-size="12" font-family="inherit">'
        ),
        f"<title>{e(title)}</title>",
        f'<desc id="{e(chart_id)}-desc">{e(description)}</desc>',
    ]
    plot_right, plot_bottom = WIDTH - RIGHT, TOP + PLOT_HEIGHT
    out.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_right - LEFT}" height="{PLOT_HEIGHT}" fill="#ffffff" stroke="none"/>'
    )
    if band is not None:
        x0, x1 = frame.px(band[0]), frame.px(band[1])
        out.append(
            f'<rect class="band" x="{_num(x0)}" y="{TOP}" width="{_num(x1 - x0)}" '
            f'height="{PLOT_HEIGHT}" fill="#f3e6c4"/>'
        )
    # grid and ticks
    out.append('<g class="axis x-axis">')
    x_ticks = log_ticks(*x_range) if log_x else [(tick, tick) for tick in linear_ticks(*x_range)]
    for tick, value in x_ticks:
        x = _num(frame.px(tick))
        out.append(f'<line x1="{x}" y1="{TOP}" x2="{x}" y2="{plot_bottom}" stroke="#e3e3e3"/>')
        out.append(f'<line x1="{x}" y1="{plot_bottom}" x2="{x}" y2="{plot_bottom + 5}" stroke="#333"/>')
        out.append(f'<text x="{x}" y="{plot_bottom + 18}" text-anchor="middle">{e(_tick_label(value))}</text>')
    out.append(
        f'<text x="{_num((LEFT + plot_right) / 2)}" y="{plot_bottom + 38}" text-anchor="middle" '
        f'font-weight="bold">{e(x_label)}</text></g>'
    )
    out.append('<g class="axis y-axis">')
    y_ticks = decade_ticks(*y_range) if log_y else linear_ticks(*y_range)
    for tick in y_ticks:
        y = _num(frame.py(tick))
        label = _decade_label(tick) if log_y else str(e(_tick_label(tick)))
        out.append(f'<line x1="{LEFT}" y1="{y}" x2="{plot_right}" y2="{y}" stroke="#e3e3e3"/>')
        out.append(f'<line x1="{LEFT - 5}" y1="{y}" x2="{LEFT}" y2="{y}" stroke="#333"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y}" dy="4" text-anchor="end">{label}</text>')
    middle = _num(TOP + PLOT_HEIGHT / 2)
    out.append(
        f'<text x="16" y="{middle}" transform="rotate(-90 16 {middle})" text-anchor="middle" '
        f'font-weight="bold">{e(y_label)}</text></g>'
    )
    out.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_right - LEFT}" height="{PLOT_HEIGHT}" fill="none" stroke="#333"/>'
    )
    # reference lines, labelled along the line
    for rule in rules:
        if rule.axis == "x":
            x = _num(frame.px(rule.at))
            out.append(
                f'<line class="rule" x1="{x}" y1="{TOP}" x2="{x}" y2="{plot_bottom}" '
                f'stroke="{rule.color}" stroke-width="1.5" stroke-dasharray="{rule.dash}"/>'
            )
        else:
            y = _num(frame.py(rule.at))
            out.append(
                f'<line class="rule" x1="{LEFT}" y1="{y}" x2="{plot_right}" y2="{y}" '
                f'stroke="{rule.color}" stroke-width="1.5" stroke-dasharray="{rule.dash}"/>'
            )
    # curves
    for s in series:
        if s.line:
            d = _path(frame, s.points)
            if d:
                dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
                out.append(
                    f'<path class="series" d="{d}" fill="none" stroke="{s.color}" '
                    f'stroke-width="2.2"{dash} stroke-linejoin="round"><title>{e(s.label)}</title></path>'
                )
        if s.dots:
            for at_x, at_y in s.points:
                if at_y is not None:
                    out.append(
                        f'<circle cx="{_num(frame.px(at_x))}" cy="{_num(frame.py(at_y))}" r="3" fill="{s.color}"/>'
                    )
    for point in points:
        data = "".join(
            f' data-{e(key)}="{e(repr(value) if isinstance(value, float) else value)}"'
            for key, value in point.data.items()
        )
        out.append(
            f'<circle class="mark" cx="{_num(frame.px(point.x))}" cy="{_num(frame.py(point.y))}" '
            f'r="5.5" fill="{point.color}" stroke="#ffffff" stroke-width="1.5"{data}>'
            f"<title>{e(point.tooltip)}</title></circle>"
        )
    # legend, one item a row below the x-axis label
    out.append('<g class="legend">')
    row = plot_bottom + BOTTOM + 6
    for label, color, dash, line, dots in legend_items:
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        if line:
            out.append(
                f'<line x1="{LEFT}" y1="{row}" x2="{LEFT + 30}" y2="{row}" stroke="{color}" stroke-width="2.2"{dash_attr}/>'
            )
        if dots:
            radius = 3 if line else 5.5
            out.append(f'<circle cx="{LEFT + 15}" cy="{row}" r="{radius}" fill="{color}"/>')
        out.append(f'<text x="{LEFT + 38}" y="{row}" dy="4">{e(label)}</text>')
        row += LEGEND_ROW
    if band is not None:
        out.append(f'<rect x="{LEFT}" y="{row - 6}" width="30" height="12" fill="#f3e6c4"/>')
        out.append(f'<text x="{LEFT + 38}" y="{row}" dy="4">{e(band[2])}</text>')
    out.append("</g></svg>")
    return Markup("\n".join(out))


# --- the release's charts ----------------------------------------------------------------


def _log10(result: SdgsDelta) -> float | None:
    if result.log10_delta is None:
        return None
    return max(result.log10_delta, LOG10_FLOOR)


def _decade_range(values: Sequence[float | None]) -> tuple[float, float]:
    """Whole decades around the values, at most up to 10^0 (a delta is at most 1), at least one
    decade wide."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return -1.0, 0.0
    high = max(min(math.ceil(max(finite)), 0), LOG10_FLOOR + 1)  # values all at the floor: one decade above it
    low = max(min(math.floor(min(finite)), high - 1), LOG10_FLOOR)
    return float(low), float(high)


def sdgs_releases(plan: Plan) -> dict[tuple[int, float], list[tuple[str, float]]]:
    """(k, beta) -> [(mechanism name, epsilon)] of every SDGS leaf of the plan, in order."""
    groups: dict[tuple[int, float], list[tuple[str, float]]] = defaultdict(list)
    for mechanism in plan.mechanisms:
        for leaf in leaves(mechanism.event):
            if isinstance(leaf, SDGS):
                groups[(leaf.k, leaf.beta)].append((mechanism.name, leaf.epsilon))
    return dict(groups)


def sdgs_chart(k: int, beta: float, releases: Sequence[tuple[str, float]], chart_id: str) -> Chart:
    """delta against epsilon for (k, beta)-SDGS: Theorem 1 and exact, releases marked."""
    assert beta < 1, "k-DGS without sampling has no delta curve (no DP for any delta < 1)"
    threshold = min_theorem1_epsilon(beta)
    top = max(eps for _, eps in releases)
    x_high = nice_ceiling(max(2 * top, 1.25 * threshold, 1.0))
    grid = np.unique(
        np.concatenate(
            [
                np.linspace(0.0, x_high, 121),
                linear_ticks(0.0, x_high),
                [threshold],
                [eps for _, eps in releases],
            ]
        )
    )
    grid = grid[grid <= x_high]
    theorem1 = dict(zip(grid.tolist(), theorem1_grid(k, beta, grid), strict=True))
    exact = dict(zip(grid.tolist(), exact_grid(k, beta, grid), strict=True))
    t1_series = [(x, _log10(theorem1[x])) for x in grid.tolist()]
    ex_series = [(x, _log10(exact[x])) for x in grid.tolist()]
    y_range = _decade_range([y for _, y in t1_series + ex_series])
    by_eps: dict[float, list[str]] = defaultdict(list)
    for name, eps in releases:
        by_eps[eps].append(name)
    names = ", ".join(name for name, _ in releases)
    title = f"δ against ε for (k = {k}, β = {beta:g})-SDGS: {names}"
    points, rules, rows = [], [], []
    for eps, who in by_eps.items():
        label = ", ".join(who)
        rules.append(Rule("x", eps, f"release ε = {eps:g} ({label})", PALETTE[2], "6 4"))
        for result, color, name in (
            (theorem1[eps], PALETTE[0], "Theorem 1"),
            (exact[eps], PALETTE[1], "exact"),
        ):
            y = _log10(result)
            if y is not None:
                points.append(
                    Point(
                        eps,
                        y,
                        color,
                        f"{label}: ε = {eps:g}, δ = {fmt_delta(result)} ({name})",
                        {
                            "release": label,
                            "curve": name,
                            "epsilon": float(eps),
                            "delta": float(result.delta or 0.0),
                            "log10-delta": float(result.log10_delta or 0.0),
                        },
                    )
                )
    rules.append(
        Rule(
            "x",
            threshold,
            f"Theorem 1 holds from ε = -ln(1 - β) = {threshold:.4g}",
            GREY,
            "2 3",
        )
    )
    sample = set(linear_ticks(0.0, x_high)) | set(by_eps) | {threshold}
    for x in sorted(sample):
        rows.append(
            (
                fmt(float(x)),  # 6 digits; the threshold row is -ln(1 - beta) itself
                fmt_delta(theorem1[x]),
                fmt_delta(exact[x]),
                ", ".join(by_eps.get(x, [])),
            )
        )
    svg = plot(
        chart_id=chart_id,
        title=title,
        description=(
            f"Log-scale delta for epsilon from 0 to {x_high:g}. Theorem 1's delta is defined from "
            f"epsilon {threshold:.4g}; the exact delta is below it everywhere. Release epsilons: "
            + "; ".join(f"{', '.join(who)} at {eps:g}" for eps, who in by_eps.items())
        ),
        x_label="ε",
        y_label="δ (log scale)",
        x_range=(0.0, x_high),
        y_range=y_range,
        log_y=True,
        series=[
            Series("Theorem 1: d(k, β, ε) (probabilistic DP)", t1_series, PALETTE[0]),
            Series("exact hockey-stick δ (approximate DP)", ex_series, PALETTE[1], "7 3"),
        ],
        points=points,
        rules=rules,
    )
    caption = (
        f"Each release of (k = {k}, β = {beta:g})-SDGS is (ε, δ)-DP for every ε on the x-axis "
        "with the δ of the curve. The dots mark the ε at which the release states its guarantee."
    )
    return Chart(
        chart_id,
        title,
        caption,
        svg,
        ("ε", "δ Theorem 1", "δ exact", "release"),
        tuple(rows),
    )


def sdgs_charts(plan: Plan) -> list[Chart]:
    """One :func:`sdgs_chart` per sampled (k, beta) of the plan's SDGS and histogram releases."""
    charts = []
    for index, ((k, beta), releases) in enumerate(sdgs_releases(plan).items()):
        if beta < 1:
            charts.append(sdgs_chart(k, beta, releases, f"chart-sdgs-{index + 1}"))
    return charts


def fsmooth_chart(plan: Plan, chart_id: str = "chart-fsmooth", x_max: float = 4.0) -> Chart | None:
    """delta0 f(x) against epsilon = x eps0 for the plan's sampled SDGS releases composed
    (Theorem 6, Theorem 5), with each release's share delta_i f_i(x) when there are several.
    None when the plan has no sampled SDGS release, or when some release's eps0 is below
    -ln(1 - beta) (Theorem 6 is stated for eps0 >= -ln(1 - beta))."""
    names, events = [], []
    for mechanism in plan.mechanisms:
        for leaf in leaves(mechanism.event):
            if isinstance(leaf, SDGS) and leaf.beta < 1:
                names.append(mechanism.name)
                events.append(leaf)
    if not events:
        return None
    smooth = accountants.fsmooth(Composed(events=tuple(events)))
    assert smooth is not None
    if any(eps0 < min_theorem1_epsilon(beta) for _, beta, eps0 in smooth.parts):
        return None
    xs = np.unique(np.concatenate([np.linspace(1.0, x_max, 61), [2.0]])).tolist()
    eps0 = smooth.epsilon0

    def log10(value: float) -> float:
        return max(math.log10(value), LOG10_FLOOR) if value > 0 else LOG10_FLOOR

    composed = [(x * eps0, log10(smooth.delta_at(x))) for x in xs]
    series = [Series("δ0 f(x): the releases composed (Theorem 5)", composed, PALETTE[0])]
    if len(events) > 1:
        for i, ((k, beta, part_eps0), name) in enumerate(zip(smooth.parts, names, strict=True)):
            share = [(x * eps0, log10(fsmooth_delta(k, beta, x * part_eps0))) for x in xs]
            series.append(
                Series(
                    f"{name}: δ_i f_i(x) (k = {k}, β = {beta:g}, ε0 = {part_eps0:g})",
                    share,
                    PALETTE[(i + 1) % len(PALETTE)],
                    ("7 3", "2 3", "8 3 2 3")[i % 3],
                )
            )
    points = [
        Point(
            x * eps0,
            log10(smooth.delta_at(x)),
            PALETTE[1],
            f"x = {x:g}: ε = {x * eps0:g}, δ = {fmt(smooth.delta_at(x))}",
            {
                "x": float(x),
                "epsilon": float(x * eps0),
                "delta": float(smooth.delta_at(x)),
            },
            "δ0 at ε0 (x = 1) and δ0 f(2) at 2 ε0 (x = 2)",
        )
        for x in (1.0, 2.0)
    ]
    title = f"f-smooth curve of the SDGS releases composed ({', '.join(names)})"
    svg = plot(
        chart_id=chart_id,
        title=title,
        description=(
            f"Theorem 6 bound delta0 f(x) at epsilon = x times {eps0:g}, for x from 1 to {x_max:g}, "
            f"log scale; delta0 = {fmt(smooth.delta0)}, f(2) = {fmt(smooth.f(2.0))}."
        ),
        x_label="ε = x · ε0",
        y_label="δ (log scale)",
        x_range=(eps0, x_max * eps0),
        y_range=_decade_range([y for s in series for _, y in s.points]),
        log_y=True,
        series=series,
        points=points,
    )
    rows = tuple(
        (fmt(x), fmt(x * eps0), fmt(smooth.delta_at(x)), fmt(smooth.f(x)))
        for x in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
        if x <= x_max
    )
    caption = (
        f"The SDGS releases together are f-smooth (ε0 = {eps0:g}, δ0 = {fmt(smooth.delta0, 4)})-DP: "
        "for every x ≥ 1 they are (x ε0, δ0 f(x))-DP (Li, Qardaji, Su, Theorems 5 and 6). "
        "Other releases (Laplace statistics, scheme selection) add their ε on top."
    )
    return Chart(chart_id, title, caption, svg, ("x", "ε = x ε0", "δ0 f(x)", "f(x)"), rows)


def splu_charts(plan: Plan) -> list[Chart]:
    """For each SPLU-Gen release: the probability that a true count f = 1..30 is estimated with
    relative error above eps (higher = more private), with the policy's alpha and T_p target."""
    targets = plan.loaded.policy.targets
    privacy = targets.splu_privacy
    eps = privacy.epsilon if privacy is not None else SPLU_DEFAULT_EPS
    alpha = privacy.alpha if privacy is not None else None
    f_max = min(max(SPLU_F_MAX, alpha or 0), 200)
    charts = []
    for index, (mechanism, event) in enumerate((m, m.event) for m in plan.mechanisms if isinstance(m.event, SPLUGen)):
        gamma = event.gamma
        counts, probability = splu_guarantees.privacy_curve(gamma, eps, f_max)
        curve = list(zip(counts.tolist(), probability.tolist(), strict=True))
        rules = []
        if privacy is not None:
            rules.append(
                Rule(
                    "y",
                    privacy.t_p,
                    f"required T_p = {privacy.t_p:g} (for f ≤ α = {privacy.alpha})",
                    PALETTE[1],
                    "6 4",
                )
            )
        points = []
        if "t_p" in mechanism.facts:
            f_min, t_p = mechanism.facts["t_p_argmin_f"], mechanism.facts["t_p"]
            points.append(
                Point(
                    f_min,
                    t_p,
                    PALETTE[1],
                    f"T_p = {fmt(t_p)} at f = {f_min}",
                    {"f": float(f_min), "t-p": float(t_p)},
                    f"achieved T_p = {fmt(t_p, 4)}: the lowest probability for f ≤ α",
                )
            )
        chart_id = f"chart-splu-{index + 1}"
        title = f"SPLU-Gen small-sum privacy of {mechanism.name} (γ = {gamma}, relative error ε = {eps:g})"
        svg = plot(
            chart_id=chart_id,
            title=title,
            description=(
                f"Probability that the published table misestimates a true count f by more than "
                f"{eps:g} f, for f from 1 to {f_max}, gamma {gamma}."
            ),
            x_label="true count f",
            y_label="P(relative error > ε)",
            x_range=(0.0, float(f_max)),
            y_range=(0.0, 1.0),
            log_y=False,
            series=[
                Series(
                    f"P(|f' − f| > {eps:g} f), γ = {gamma}",
                    curve,
                    PALETTE[0],
                    dots=True,
                )
            ],
            points=points,
            rules=rules,
            band=None if alpha is None else (0.5, alpha + 0.5, f"small counts protected: f ≤ α = {alpha}"),
        )
        rows = tuple((str(f), fmt(p), "yes" if alpha is not None and f <= alpha else "") for f, p in curve)
        caption = (
            "SPLU-Gen is not differential privacy. Its small-sum privacy says that a value occurring "
            f"only f times (f ≤ α) is estimated from the release with a relative error above {eps:g} "
            "with at least probability T_p (Fu et al., Theorem 4); the curve drops as f grows "
            "(large counts stay useful)."
        )
        charts.append(Chart(chart_id, title, caption, svg, ("f", "probability", "f ≤ α"), rows))
    return charts


PUBLICATION_POINTS = 80
"""Cell sizes charted on a publication curve."""


def publication_chart(k: int, beta: float, names: Sequence[str], targets: Sequence[Any], chart_id: str) -> Chart:
    """The publication curve of (k, beta)-SDGS cells (microdata and histograms): for a cell of N
    people, the probability that it is published (P[Bin(N, beta) >= k]) and the relative
    standard error of its estimate N / beta (sqrt((1 - beta) / (N beta))); each accuracy target
    of the policy marked at its count (P[published and within +-r])."""
    from privrelease.mechanisms.accuracy import count_accuracy

    reach = max(k, math.ceil(k / beta))
    top = float(nice_ceiling(max([5 * reach, *(1.25 * t.count for t in targets)])))
    sizes = sorted({max(1, round(top * i / PUBLICATION_POINTS)) for i in range(PUBLICATION_POINTS + 1)} | {reach})
    statements = [count_accuracy(k, beta, n) for n in sizes]
    published = [(float(s.count), s.publish_probability) for s in statements]
    error = [(float(s.count), min(1.0, s.relative_standard_error)) for s in statements]
    points = []
    for target in targets:
        result = count_accuracy(k, beta, target.count, relative_error=target.relative_error)
        if result.count <= top:
            points.append(
                Point(
                    float(result.count),
                    float(result.within or 0.0),
                    PALETTE[2],
                    f"{target.mechanism}: a cell of {result.count} people is published and within "
                    f"±{target.relative_error:g} with probability {fmt(result.within, 4)} (required ≥ {target.confidence:g})",
                    {"count": float(result.count), "within": float(result.within or 0.0)},
                    "accuracy target: P(published and within ±r)",
                )
            )
    title = f"Publication curve of {', '.join(names)} (k = {k}, β = {beta:g})"
    svg = plot(
        chart_id=chart_id,
        title=title,
        description=(
            f"For a cell of N people from 1 to {top:g}: the probability that it is published and the "
            f"relative standard error of its estimate count/beta, k {k}, beta {beta:g}."
        ),
        x_label="people in a cell (N)",
        y_label="probability / relative error",
        x_range=(0.0, top),
        y_range=(0.0, 1.0),
        log_y=False,
        series=[
            Series("P(published) = P(Bin(N, β) ≥ k)", published, PALETTE[0]),
            Series("relative standard error of count/β", error, PALETTE[1], dash="6 4"),
        ],
        points=points,
        rules=[Rule("x", float(reach), f"k/β = {reach}: the expected sample reaches k")],
    )
    rows = tuple(
        (str(s.count), fmt(s.publish_probability, 4), fmt(s.relative_standard_error, 4))
        for s in statements[:: max(1, len(statements) // 20)]
    )
    caption = (
        "A cell is published only when at least k of its people are sampled, so small cells are "
        "usually suppressed and, when published, overestimated (the bias column of the accuracy "
        "table); from about k/β people on, cells are published and their estimate count/β has "
        "the relative standard error shown."
    )
    return Chart(chart_id, title, caption, svg, ("N", "P(published)", "relative standard error"), rows)


def publication_charts(plan: Plan) -> list[Chart]:
    """One publication curve per distinct (k, beta) of the plan's sampled SDGS releases
    (microdata and histograms)."""
    policy = plan.loaded.policy
    groups = {key: [name for name, _ in releases] for key, releases in sdgs_releases(plan).items() if key[1] < 1}
    charts = []
    for index, ((k, beta), names) in enumerate(groups.items()):
        targets = [t for t in policy.targets.accuracy if t.mechanism in names and t.count is not None]
        charts.append(publication_chart(k, beta, names, targets, f"chart-publication-{index + 1}"))
    return charts


FRONTIER_REACH = 4.0
"""A frontier's privacy axis reaches this many times the larger of the policy's epsilon and
``max_epsilon``; larger epsilons are left off the drawing (they stay in the table)."""


def frontier_chart(name: str, frontier: Frontier, chart_id: str) -> Chart:
    """The privacy-accuracy frontier of one mechanism's parameter, in two panels sharing the x
    axis (the parameter, log scale when ``frontier.log_x``): above, the epsilon at the target
    delta (the policy's ``max_epsilon`` as a rule); below, the kind's accuracy measure (the
    accuracy target as a rule); the policy's value marked on both. Drawn from the
    :class:`~privrelease.mechanisms.kinds.Frontier` alone: any kind's frontier."""
    values, privacy, accuracy, chosen = frontier.values, frontier.privacy, frontier.accuracy, frontier.chosen
    at = frontier.chosen_index

    def x(value: float) -> float:
        return math.log10(value) if frontier.log_x else value

    x_range = (x(values[0]), x(values[-1])) if frontier.log_x else (0.0, nice_ceiling(values[-1]))
    finite = [p for p in privacy if math.isfinite(p)]
    anchors = [v for v in (privacy[at], frontier.privacy_target) if v is not None and math.isfinite(v) and v > 0]
    reach = FRONTIER_REACH * max(anchors) if anchors else max(finite, default=1.0)
    top = nice_ceiling(max(min(max(finite, default=1.0), reach), 1.1 * (frontier.privacy_target or 0.0)))
    drawn = [(x(v), p if math.isfinite(p) and p <= top else None) for v, p in zip(values, privacy, strict=True)]
    rule = Rule("x", x(chosen), f"the release's {frontier.parameter} = {chosen:g}", PALETTE[2], "6 4")
    param = f"{frontier.parameter} (log scale)" if frontier.log_x else frontier.parameter
    privacy_points = []
    if math.isfinite(privacy[at]):
        privacy_points.append(
            Point(
                x(chosen),
                privacy[at],
                PALETTE[0],
                f"{name}: {frontier.parameter} = {chosen:g}, {frontier.privacy_label}: {fmt(privacy[at])}",
                {"parameter": float(chosen), "epsilon": float(privacy[at])},
            )
        )
    privacy_svg = plot(
        chart_id=f"{chart_id}-privacy",
        title=f"Privacy of {name} against {frontier.parameter}",
        description=(
            f"{frontier.privacy_label} for {frontier.parameter} from {values[0]:g} to {values[-1]:g}; "
            f"the release's {frontier.parameter} is {chosen:g}, where it is {fmt(privacy[at])}."
        ),
        x_label=param,
        y_label="ε (lower: more private)",
        x_range=x_range,
        y_range=(0.0, top),
        log_y=False,
        log_x=frontier.log_x,
        series=[Series(frontier.privacy_label, drawn, PALETTE[0], dots=True)],
        points=privacy_points,
        rules=[rule]
        + (
            [Rule("y", frontier.privacy_target, f"max ε = {frontier.privacy_target:g} (the whole release)", PALETTE[1])]
            if frontier.privacy_target is not None
            else []
        ),
    )
    accuracy_top = nice_ceiling(max([*accuracy, frontier.accuracy_target or 0.0]))
    better = "higher" if frontier.higher_is_more_accurate else "lower"
    accuracy_svg = plot(
        chart_id=f"{chart_id}-accuracy",
        title=f"Accuracy of {name} against {frontier.parameter}",
        description=(
            f"{frontier.accuracy_label} for {frontier.parameter} from {values[0]:g} to {values[-1]:g}; "
            f"the release's {frontier.parameter} is {chosen:g}, where it is {fmt(accuracy[at])}."
        ),
        x_label=param,
        y_label=f"accuracy ({better}: better)",
        x_range=x_range,
        y_range=(0.0, accuracy_top),
        log_y=False,
        log_x=frontier.log_x,
        series=[
            Series(
                frontier.accuracy_label,
                [(x(v), a) for v, a in zip(values, accuracy, strict=True)],
                PALETTE[4],
                "7 3",
                dots=True,
            )
        ],
        points=[
            Point(
                x(chosen),
                accuracy[at],
                PALETTE[4],
                f"{name}: {frontier.parameter} = {chosen:g}, {frontier.accuracy_label}: {fmt(accuracy[at])}",
                {"parameter": float(chosen), "accuracy": float(accuracy[at])},
            )
        ],
        rules=[rule]
        + (
            [Rule("y", frontier.accuracy_target, frontier.accuracy_target_label or "accuracy target", PALETTE[1])]
            if frontier.accuracy_target is not None
            else []
        ),
    )
    off = [v for v, p in zip(values, privacy, strict=True) if not (math.isfinite(p) and p <= top)]
    caption = (
        f"What {frontier.parameter} (the policy's {frontier.setting}) costs and buys, before any data is read: "
        f"above, {frontier.privacy_label} of this mechanism alone; below, its accuracy. The release's "
        f"{frontier.parameter} = {chosen:g} gives ε = {fmt(privacy[at], 4)} and "
        f"{frontier.accuracy_label} = {fmt(accuracy[at], 4)}. "
        f"{frontier.note}"
        + (
            f" Not drawn above (ε beyond {top:g}, or no ε reaches the target δ): "
            f"{frontier.parameter} = {', '.join(fmt(v, 4) for v in off)}."
            if off
            else ""
        )
    )
    rows = tuple(  # to the caption's 4 digits, so the policy's row reads as the caption does
        (f"{v:g}", fmt(p, 4), fmt(a, 4), "policy" if v == chosen else "")
        for v, p, a in zip(values, privacy, accuracy, strict=True)
    )
    return Chart(
        chart_id,
        f"Privacy-accuracy frontier of {name} over {frontier.parameter}",
        caption,
        Markup(f"{privacy_svg}\n{accuracy_svg}"),
        (frontier.parameter, frontier.privacy_label, frontier.accuracy_label, "policy"),
        rows,
    )


def frontier_charts(plan: Plan) -> list[Chart]:
    """One :func:`frontier_chart` for each mechanism of the policy whose kind has a frontier
    (:meth:`~privrelease.mechanisms.kinds.MechanismKind.frontier`)."""
    charts: list[Chart] = []
    for mechanism in plan.loaded.policy.mechanisms:
        frontier = mechanism.frontier(plan.loaded)
        if frontier is not None:
            charts.append(frontier_chart(mechanism.name, frontier, f"chart-frontier-{len(charts) + 1}"))
    return charts


def all_charts(plan: Plan) -> list[Chart]:
    """Every chart of the plan: SDGS delta curves, the f-smooth curve, publication curves,
    SPLU curves, privacy-accuracy frontiers."""
    charts = sdgs_charts(plan)
    smooth = fsmooth_chart(plan)
    if smooth is not None:
        charts.append(smooth)
    return charts + publication_charts(plan) + splu_charts(plan) + frontier_charts(plan)


def ledger_chart(curve: dict, chart_id: str = "chart-ledger") -> Chart:
    """The composed privacy curve of the dataset's history (``curve`` as
    :func:`privrelease.audit.ledger.history_curve` makes it): delta against epsilon before and
    after this release, log scale, with the lifetime budget (epsilon, delta) marked."""
    epsilons, budget = curve["epsilons"], curve["budget"]
    floor = math.log10(budget["delta"]) - 8  # eight decades below the budget: enough to read the curves

    def log10(value: float) -> float:
        return max(math.log10(value), floor) if value > 0 else floor

    before = curve["before"] or [None] * len(epsilons)
    series = [
        Series(
            f"after this release ({curve['releases_after']} release{'s' if curve['releases_after'] != 1 else ''})",
            [(e, log10(d)) for e, d in zip(epsilons, curve["after"], strict=True)],
            PALETTE[1],
        )
    ]
    if curve["before"]:
        series.insert(
            0,
            Series(
                f"before this release ({curve['releases_before']} release{'s' if curve['releases_before'] != 1 else ''})",
                [(e, log10(d)) for e, d in zip(epsilons, before, strict=True)],
                PALETTE[0],
                "7 3",
            ),
        )
    point = Point(
        budget["epsilon"],
        log10(budget["delta"]),
        PALETTE[2],
        f"lifetime budget: ε = {fmt(budget['epsilon'])}, δ = {fmt(budget['delta'])}",
        {"epsilon": float(budget["epsilon"]), "delta": float(budget["delta"])},
        "the lifetime budget (ε, δ)",
    )
    values = [y for s in series for _, y in s.points if y is not None] + [point.y]
    title = "Lifetime privacy curve of the dataset"
    svg = plot(
        chart_id=chart_id,
        title=title,
        description=(
            f"Composed delta against epsilon of every counting release of the dataset, before and after "
            f"this release (log scale); the lifetime budget is epsilon {fmt(budget['epsilon'])}, delta "
            f"{fmt(budget['delta'])}."
        ),
        x_label="ε",
        y_label="δ (log scale)",
        x_range=(0.0, max(epsilons)),
        y_range=_decade_range(values),
        log_y=True,
        series=series,
        points=[point],
        rules=[Rule("x", budget["epsilon"], "lifetime ε")],
    )
    rows = tuple((fmt(e), fmt(b), fmt(a)) for e, b, a in zip(epsilons, before, curve["after"], strict=True))
    runway = curve["runway"]
    more = "+" if runway["capped"] else ""
    caption = (
        f"The release fits while the curve after it passes below the budget point (composed by "
        f"{curve['method']}; spent: ε = {fmt(curve['spent']['epsilon'])} at the lifetime δ). "
        f"After this release, {runway['runs']}{more} more run{'s' if runway['runs'] != 1 else ''} "
        "of this policy fit the lifetime budget."
    )
    return Chart(chart_id, title, caption, svg, ("ε", "δ before", "δ after"), rows[:: max(1, len(rows) // 12)])
