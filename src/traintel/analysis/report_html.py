"""``traintel report --html``: one self-contained page with the report's charts.

Why inline SVG drawn here rather than a JavaScript charting library: the file must open
offline, from an email or a CI artifact, with no CDN and nothing to execute; SVG renders in
every browser and the numbers behind each mark are in its ``<title>`` tooltip. The page shows
the same :class:`~traintel.analysis.report.Report` as the terminal and JSON views.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from traintel.analysis.links import TraceLinks
from traintel.analysis.ranks import SPREADS, UNMARKED_COMPUTE, straggler_text, unmarked
from traintel.analysis.report import MetricPoint, Report, WindowPoint
from traintel.analysis.report_text import fmt_num, fmt_pct, fmt_s, iteration_mean
from traintel.analysis.run_info import utc_text
from traintel.analysis.summary import (
    RunSummary,
    energy_figures,
    energy_text,
    phase_rows,
    plain_number,
    sampled_note,
    summed_over,
)
from traintel.semconv import BADPUT_CATEGORIES, Phase

_PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
_PHASE_COLOUR = {
    Phase.APPLICATION.value: "#d0d7e1",
    Phase.TRAINING_LOOP.value: "#59a14f",
    Phase.VALIDATION_LOOP.value: "#b07aa1",
    Phase.TESTING_LOOP.value: "#9c755f",
    Phase.CHECKPOINT_SAVE_SYNC.value: "#e15759",
    Phase.CHECKPOINT_SAVE_ASYNC.value: "#ff9da7",
    Phase.CHECKPOINT_LOAD.value: "#f28e2b",
    Phase.CHECKPOINT_FINALIZE.value: "#ffbe7d",
}
_INIT = {p.value for p in (Phase.DIST_INIT, Phase.DATA_LOADER_INIT, Phase.MODEL_INIT, Phase.OPTIMIZER_INIT)}
_LANES = ("application", "init", "training_loop", "checkpoint", "evaluation", "other")
_LANE_OF = {phase: "init" for phase in (*_INIT, Phase.CHECKPOINT_LOAD.value)} | {
    Phase.APPLICATION.value: "application",
    Phase.TRAINING_LOOP.value: "training_loop",
    Phase.VALIDATION_LOOP.value: "evaluation",
    Phase.TESTING_LOOP.value: "evaluation",
}
_W, _H, _PAD = 760, 240, 64
#: Values this close (relative) are one value: a constant learning rate read back as
#: ``0.001`` and ``0.0010000000000000000007`` must draw flat, not zoom onto the noise.
_NOISE = 1e-9
#: Width of one character of a 10-pixel axis label, generously (labels must never be clipped).
_CHAR_W = 6.5
#: A chart with more points than this draws its lines without a marker (and tooltip) per point:
#: a page must stay light with many ranks.
MARKERS = 3000

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:880px;
color:#222;background:#fff}
h1{font-size:1.5em;margin-bottom:0}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:4px}table{border-collapse:collapse;margin:8px 0;font-size:.9em}
td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #eee}
td:first-child,th:first-child{text-align:left}
svg{display:block;margin:8px 0;background:#fcfcfd;border:1px solid #eee}
.legend span{display:inline-block;margin-right:14px;font-size:.85em}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
.warn{color:#b35900}.none{color:#888}
tr.diff td,td.worse,td.better{font-weight:bold}tr.diff td{background:#fff4d6}
td.worse{color:#c0392b;background:#fdecea}td.better{color:#1e7e34;background:#e8f5e9}
details{margin:6px 0}summary{cursor:pointer;color:#555}
td code{font-size:.85em}td.name{text-align:left;word-break:break-all;max-width:300px}
td.when{white-space:nowrap}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _svg(svg_id: str, height: float, classes: str = "chart") -> str:
    """The opening tag of a chart the page's width wide (its ``</svg>`` is the caller's)."""
    return (
        f'<svg id="{svg_id}" class="{classes}" width="{_W}" height="{height}" viewBox="0 0 {_W} {height}" '
        'xmlns="http://www.w3.org/2000/svg" role="img">'
    )


def _text(
    x: float,
    y: float,
    content: object,
    size: int = 10,
    anchor: str = "start",
    bold: bool = False,
    tick_end: bool = False,
) -> str:
    if tick_end:  # the last x tick sits on the chart's right edge: its text ends there
        anchor, x = "end", min(x + 8, _W - 2)
    weight = ' font-weight="bold"' if bold else ""
    head = f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{weight}>'
    return f"{head}{_e(content)}</text>"


def _nice_max(value: float) -> float:
    if value <= 0 or not math.isfinite(value):
        return 1.0
    exponent = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * exponent:
            return step * exponent
    return 10 * exponent


def _compact(value: float) -> str:
    """An axis label: ``12.5k``, ``3M``, ``0.003`` (suffixes for thousands up, never ``1e-05``)."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{plain_number(value / scale, 3)}{suffix}"
    return plain_number(value, 3)


def _nice_range(low: float, high: float) -> tuple[list[float], int]:
    """Ticks at a round step spanning ``[low, high]`` (not forced through zero: a loss going
    from 2.31 to 2.18 must show its slope), and the decimals the step needs."""
    if high - low <= _NOISE * max(abs(low), abs(high)):  # constant, or apart by float noise only
        middle = (low + high) / 2
        pad = abs(middle) * 0.1 or 1.0
        low, high = middle - pad, middle + pad
    step = _nice_max((high - low) / 4)
    first = math.floor(low / step) * step
    count = math.ceil(round((high - first) / step, 9))
    return [first + i * step for i in range(count + 1)], _step_decimals(step)


def _step_decimals(step: float) -> int:
    """Decimals that tell ticks ``step`` apart: 0.05 -> 2, 0.025 -> 3, 20 -> 0."""
    exponent = math.floor(math.log10(step))
    mantissa = round(step / 10.0**exponent, 6)
    return max(0, -exponent + (0 if mantissa.is_integer() else 1))


def _zero_ticks(y_max: float, y_fmt: str) -> list[tuple[float, str]]:
    return [(y_max * i / 4, _label(y_max * i / 4, y_fmt)) for i in range(5)]


def _pad_for(ticks: list[tuple[float, str]]) -> float:
    """The left margin that holds the longest tick label whole."""
    return max(_PAD, 12 + _CHAR_W * max((len(label) for _, label in ticks), default=0))


def _label(value: float, y_fmt: str) -> str:
    return fmt_s(value) if y_fmt == "s" else fmt_pct(value) if y_fmt == "%" else _compact(value)


def _y(value: float, low: float, high: float) -> float:
    """The SVG y of a value on an axis from ``low`` (bottom) to ``high`` (top), clamped."""
    share = (min(max(value, low), high) - low) / (high - low) if high > low else 0.0
    return _H - 30 - (_H - 40) * share


def _grid(
    ticks: list[tuple[float, str]],
    low: float,
    high: float,
    x_min: float,
    x_max: float,
    x_label: str,
    x_ticks: bool = True,
) -> list[str]:
    pad = _pad_for(ticks)
    parts = [
        f'<line x1="{pad}" y1="{_H - 30}" x2="{_W - 10}" y2="{_H - 30}" stroke="#999"/>',
        f'<line x1="{pad}" y1="10" x2="{pad}" y2="{_H - 30}" stroke="#999"/>',
    ]
    for value, label in ticks:
        y = _y(value, low, high)
        parts.append(f'<line x1="{pad}" y1="{y:.1f}" x2="{_W - 10}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(_text(pad - 4, y + 4, label, anchor="end"))
    for i in range(5 if x_ticks else 0):
        value = x_min + (x_max - x_min) * i / 4
        x = pad + (_W - pad - 10) * i / 4
        parts.append(_text(x, _H - 16, f"{value:,.0f}", anchor="middle", tick_end=i == 4))
    parts.append(_text(_W / 2, _H - 5, x_label, 11, "middle"))
    return parts


@dataclass(frozen=True)
class ChartLine:
    """One line of a chart: its points, and the tooltip of each point's marker. A point that
    stands for a range of x (a window of iterations: ``starts`` holds where each begins) is drawn
    as a level over that range, the marker at its end: a run of one window is a line across its
    iterations, not a dot on an axis of one iteration."""

    label: str
    colour: str
    points: list[tuple[float, float]]
    dashed: bool = False
    tips: list[str] | None = None  # one per point; default "label: x: y"
    starts: list[float] | None = None  # one per point

    def drawn(self) -> list[tuple[float, float]]:
        """The points the line passes through: each range's start and end, else the points."""
        if self.starts is None:
            return self.points
        return [
            xy for start, (x, y) in zip(self.starts, self.points, strict=True) for xy in ((start, y), (x, y))
        ]


def line_chart(
    lines: Sequence[ChartLine], y_fmt: str, x_label: str, chart_id: str, zero_based: bool = True
) -> str:
    """Lines in one SVG, each point a marker whose tooltip holds its numbers. Non-finite
    values are left out of the drawing (their tooltips elsewhere say so)."""
    shown = [_finite(line) for line in lines]
    points = [p for line in shown for p in line.drawn()]
    if not points:
        return '<p class="none">no data</p>'
    x_min = min(x for x, _ in points)
    x_max = max(*(x for x, _ in points), x_min + 1)
    if zero_based:
        low, high = 0.0, _nice_max(max(y for _, y in points))
        ticks = _zero_ticks(high, y_fmt)
    else:
        values, decimals = _nice_range(min(y for _, y in points), max(y for _, y in points))
        low, high = values[0], values[-1]
        ticks = [(v, f"{v:,.{decimals}f}") for v in values]
    grid = _grid(ticks, low, high, x_min, x_max, x_label)
    pad = _pad_for(ticks)
    parts = [_svg(chart_id, _H), *grid]
    legend = []
    markers = sum(len(line.points) for line in shown) <= MARKERS
    width = (_W - pad - 10) / (x_max - x_min)

    def at(x: float, y: float) -> tuple[float, float]:
        return pad + width * (x - x_min), _y(y, low, high)

    for line in shown:
        if not line.points:
            continue
        parts.append(_polyline(line, [at(x, y) for x, y in line.drawn()]))
        if markers:
            parts += _markers(line, [at(x, y) for x, y in line.points], y_fmt)
        legend.append(f'<span><i style="background:{line.colour}"></i>{_e(line.label)}</span>')
    parts.append("</svg>")
    return "".join(parts) + f'<div class="legend">{"".join(legend)}</div>'


def _finite(line: ChartLine) -> ChartLine:
    kept = [i for i, (_, y) in enumerate(line.points) if math.isfinite(y)]
    if len(kept) == len(line.points):
        return line
    tips = [line.tips[i] for i in kept] if line.tips is not None else None
    starts = [line.starts[i] for i in kept] if line.starts is not None else None
    return ChartLine(line.label, line.colour, [line.points[i] for i in kept], line.dashed, tips, starts)


def _polyline(line: ChartLine, xy: list[tuple[float, float]]) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dash = ' stroke-dasharray="5,3"' if line.dashed else ""
    return (
        f'<polyline class="series" fill="none" stroke="{line.colour}" stroke-width="1.8"{dash} '
        f'points="{coords}"><title>{_e(line.label)}</title></polyline>'
    )


def _markers(line: ChartLine, xy: list[tuple[float, float]], y_fmt: str) -> list[str]:
    """A dot per point with its numbers as the tooltip (what the README promises of every mark)."""
    tips = line.tips or [f"{line.label}: {x:,.0f}: {_label(y, y_fmt)}" for x, y in line.points]
    return [
        f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{line.colour}">'
        f"<title>{_e(tip)}</title></circle>"
        for (x, y), tip in zip(xy, tips, strict=True)
    ]


def _lane(phase: str) -> str:
    return _LANE_OF.get(phase) or ("checkpoint" if phase.startswith("checkpoint") else "other")


def gantt(report: Report) -> str:
    """Phases over time, a band of lanes per process."""
    if not report.timeline:
        return '<p class="none">no phase spans</p>'
    start = min(i.start_ns for i in report.timeline)
    end = max(*(i.end_ns for i in report.timeline), start + 1)
    processes = report.rank_labels()
    row_h, label_w = 14, 150
    height = 20 + row_h * (len(_LANES) + 1) * len(processes) + 8 * len(processes) + 20
    scale = (_W - label_w - 10) / (end - start)
    parts = [_svg("timeline", height)]
    lane_y: dict[tuple[str, str], float] = {}
    y = 10.0
    for key, label in processes:
        parts.append(_text(4, y + 10, label, 11, bold=True))
        y += row_h
        for lane in _LANES:
            lane_y[(key, lane)] = y
            parts.append(_text(label_w - 6, y + 10, lane, anchor="end"))
            y += row_h
        y += 8
    for interval in report.timeline:
        x = label_w + (interval.start_ns - start) * scale
        w = max(1.0, (interval.end_ns - interval.start_ns) * scale)
        ly = lane_y[(interval.process, _lane(interval.phase))]
        colour = _PHASE_COLOUR.get(interval.phase, "#76b7b2" if interval.phase in _INIT else "#bab0ac")
        stroke = ' stroke="#c00" stroke-width="1.5"' if interval.error else ""
        tip = f"{interval.phase}: {fmt_s((interval.end_ns - interval.start_ns) / 1e9)}"
        parts.append(
            f'<rect class="phase" x="{x:.1f}" y="{ly + 1:.1f}" width="{w:.1f}" height="{row_h - 2}" '
            f'fill="{colour}"{stroke}><title>{_e(tip)}</title></rect>'
        )
    total_s = (end - start) / 1e9
    parts.append(_text(label_w, height - 4, "0") + _text(_W - 10, height - 4, fmt_s(total_s), anchor="end"))
    parts.append("</svg>")
    dropped = (
        f'<p class="warn">{report.timeline_dropped:,} later phase spans not drawn</p>'
        if report.timeline_dropped
        else ""
    )
    return "".join(parts) + dropped


def waterfall(report: Report) -> str:
    """Per session: productive time, then each badput category stacked on what came before."""
    out = []
    for n, session in enumerate(report.goodput):
        total = session.total_s
        if total <= 0:
            continue
        steps = [("productive", session.productive_s, "#59a14f")] + [
            (c, session.badput_s.get(c, 0.0), _PALETTE[i % len(_PALETTE)])
            for i, c in enumerate(BADPUT_CATEGORIES)
            if session.badput_s.get(c, 0.0) > 0
        ]
        bar_h, label_w = 20, 170
        height = 10 + bar_h * (len(steps) + 1) + 10
        scale = (_W - label_w - 90) / total
        parts = [_svg(f"goodput-{n}", height, "chart goodput")]
        offset = 0.0
        y = 10.0
        for label, seconds, colour in steps:
            x = label_w + offset * scale
            parts.append(_text(label_w - 6, y + 14, label, 11, "end"))
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{y + 2:.1f}" width="{max(1.0, seconds * scale):.1f}" '
                f'height="{bar_h - 4}" fill="{colour}"><title>{_e(label)}: {_e(fmt_s(seconds))}</title>'
                "</rect>"
            )
            parts.append(_text(x + seconds * scale + 4, y + 14, fmt_pct(seconds / total)))
            offset += seconds
            y += bar_h
        parts.append(_text(label_w - 6, y + 14, "total", 11, "end", bold=True))
        parts.append(
            f'<rect x="{label_w}" y="{y + 2:.1f}" width="{total * scale:.1f}" '
            f'height="{bar_h - 4}" fill="#999"/>'
        )
        parts.append(_text(label_w + total * scale + 4, y + 14, fmt_s(total)))
        parts.append("</svg>")
        out.append(f"<h3>session {_e(session.session or '-')}: goodput {_e(fmt_pct(session.goodput))}</h3>")
        out.append("".join(parts))
    return "".join(out) or '<p class="none">no goodput data</p>'


def checkpoint_chart(report: Report) -> str:
    if not report.saves:
        return '<p class="none">no checkpoint saves</p>'
    longest = _nice_max(max(c.duration_s for c in report.saves))
    shown = report.saves[:60]
    bar_w = min(40.0, max(4.0, (_W - _PAD - 20) / max(len(shown), 1) - 2))
    parts = [_svg("checkpoints", _H)]
    counts = report.checkpoints()
    total, failed = counts["saves"], counts["failed_saves"]
    which = f"the first {len(shown):,} of {total:,} saves" if total > len(shown) else "saves in order"
    x_label = f"{which}{f', {failed:,} failed' if failed else ''} (hover for iteration and size)"
    parts += _grid(_zero_ticks(longest, "s"), 0.0, longest, 1, len(shown), x_label, x_ticks=False)
    for i, save in enumerate(shown):
        h = (_H - 40) * save.duration_s / longest
        x = _PAD + 2 + i * (bar_w + 2)
        colour = _PHASE_COLOUR.get(save.phase, "#e15759")
        size = f", {save.size_bytes / 1e6:,.2f} MB" if save.size_bytes else ""
        tip = f"{save.process} {save.phase} at iteration {save.iteration}: {fmt_s(save.duration_s)}{size}"
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{_H - 30 - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
            f'fill="{colour}"><title>{_e(tip)}</title></rect>'
        )
    parts.append("</svg>")
    stages = ""
    if report.stage_s:
        rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(fmt_s(v))}</td></tr>" for k, v in report.stage_rows())
        stages = f"<table><tr><th>stage</th><th>total</th></tr>{rows}</table>"
    return "".join(parts) + stages


def heatmap(report: Report) -> str:
    """Ranks x iteration ranges, coloured by mean iteration time (a rank that lags without
    synchronising is a hot row; a synchronising job's straggler is in :func:`_across_ranks`)."""
    processes = [(key, label) for key, label in report.rank_labels() if report.processes[key].timing()]
    if len(processes) < 2:
        return '<p class="none">one rank only: no heatmap</p>'
    series = {key: report.processes[key].timing() for key, _ in processes}
    first = min(p.first_iteration for pts in series.values() for p in pts)
    last = max(p.last_iteration for pts in series.values() for p in pts)
    bins = min(60, max(1, last - first + 1))
    span = (last - first + 1) / bins
    grid: dict[tuple[str, int], list[float]] = {}
    for key, pts in series.items():
        for p in pts:
            b = min(bins - 1, int((p.first_iteration - first) / span))
            grid.setdefault((key, b), []).append(p.mean_s)
    values = [sum(v) / len(v) for v in grid.values()]
    lo, hi = min(values), max(values)
    label_w, cell_h = 150, 18
    cell_w = (_W - label_w - 10) / bins
    height = 10 + cell_h * len(processes) + 24
    parts = [_svg("heatmap", height)]
    for row, (key, label) in enumerate(processes):
        y = 10 + row * cell_h
        parts.append(_text(label_w - 6, y + 13, label, 11, "end"))
        for b in range(bins):
            cell = grid.get((key, b))
            if not cell:
                continue
            mean = sum(cell) / len(cell)
            t = 0.0 if hi == lo else (mean - lo) / (hi - lo)
            colour = f"rgb({int(255 * t)},{int(80 + 100 * (1 - t))},{int(200 * (1 - t))})"
            lo_it = first + int(b * span)
            tip = f"{label}, iterations from {lo_it}: mean {fmt_s(mean)}"
            parts.append(
                f'<rect class="cell" x="{label_w + b * cell_w:.1f}" y="{y}" width="{cell_w + 0.5:.1f}" '
                f'height="{cell_h - 2}" fill="{colour}"><title>{_e(tip)}</title></rect>'
            )
    parts.append(
        _text(label_w, height - 6, f"iteration {first:,}")
        + _text(_W - 10, height - 6, f"{last:,} · blue {fmt_s(lo)} → red {fmt_s(hi)}", anchor="end")
        + "</svg>"
    )
    return "".join(parts)


def _series_lines(report: Report, value: str) -> list[ChartLine]:
    """Per process: iteration time (mean, and p99 dashed), or a rate, per window."""
    lines: list[ChartLine] = []
    fmt: Callable[[float], str] = fmt_s if value == "time" else fmt_pct if value == "mfu" else fmt_num
    for n, (key, label) in enumerate(report.rank_labels()):
        process = report.processes[key]
        throughput = value in ("samples_per_second", "tokens_per_second")
        pts: list[WindowPoint] = process.series.all() if throughput else process.timing()
        colour = _PALETTE[n % len(_PALETTE)]
        if value == "time":
            lines.append(window_line(f"{label} mean", colour, pts, lambda p: p.mean_s, fmt))
            lines.append(window_line(f"{label} p99", colour, pts, lambda p: p.p99_s, fmt, dashed=True))
        else:
            line = window_line(label, colour, pts, lambda p: getattr(p, value), fmt)
            if line.points:
                lines.append(line)
    return lines


def window_line(
    label: str,
    colour: str,
    points: list[WindowPoint],
    value: Callable[[WindowPoint], float | None],
    fmt: Callable[[float], str],
    dashed: bool = False,
) -> ChartLine:
    kept = [(p, y) for p in points if (y := value(p)) is not None]
    return ChartLine(
        label,
        colour,
        [(float(p.last_iteration), float(y)) for p, y in kept],
        dashed,
        [f"{label}: {_iterations(p.first_iteration, p.last_iteration)}: {fmt(y)}" for p, y in kept],
        [float(p.first_iteration) for p, _ in kept],
    )


def _iterations(first: int, last: int) -> str:
    return f"iteration {first:,}" if first == last else f"iterations {first:,}-{last:,}"


def _metric_lines(report: Report, name: str) -> list[ChartLine]:
    """One :func:`metric_line` per process that recorded the metric."""
    return [
        metric_line(label, _PALETTE[n % len(_PALETTE)], name, report.processes[key].metrics[name].all())
        for n, (key, label) in enumerate(report.rank_labels())
        if name in report.processes[key].metrics
    ]


def metric_line(label: str, colour: str, name: str, points: list[MetricPoint]) -> ChartLine:
    """A metric's means (its last value where a window has no finite mean), each point's tooltip
    with the window's iterations, mean and last."""

    def tip(point: MetricPoint) -> str:
        windows = f" ({point.windows} windows)" if point.windows > 1 else ""
        where = _iterations(point.first_iteration, point.last_iteration)
        return f"{label} · {name}, {where}{windows}: mean {fmt_num(point.mean)}, last {fmt_num(point.last)}"

    means = [(float(p.last_iteration), p.mean if p.mean is not None else p.last) for p in points]
    return ChartLine(
        label, colour, means, tips=[tip(p) for p in points], starts=[float(p.first_iteration) for p in points]
    )


def model_metrics(report: Report) -> str:
    """A chart per model metric (``record_metrics``), then the last values as in the terminal."""
    names = report.model_metric_names()
    if not names:
        return (
            '<p class="none">no model metrics recorded (traintel.record_metrics(loss=..., lr=...) '
            "inside each training iteration records them per window; between iterations, on the loop)</p>"
        )
    parts = []
    for i, name in enumerate(names):
        lines = _metric_lines(report, name)
        nonfinite = sum(1 for line in lines for _, y in line.points if not math.isfinite(y))
        parts.append(f"<h3>{_e(name)}</h3>")
        parts.append(line_chart(lines, "n", "iteration", f"model-metric-{i}", zero_based=False))
        if nonfinite:
            parts.append(f'<p class="warn">{nonfinite:,} window(s) with a non-finite value, not drawn</p>')
    dropped = {name for process in report.processes.values() for name in process.metrics_dropped}
    if dropped:
        names_left = _e(", ".join(sorted(dropped)))
        parts.append(f'<p class="warn">{len(dropped):,} more metric(s) not drawn: {names_left}</p>')
    return "".join(parts) + _last_metrics_table(report)


def _last_metrics_table(report: Report) -> str:
    s = report.summary
    rows = [
        (name, fmt_num(stats.get("last")), fmt_num(stats.get("mean")), "last window")
        for name, stats in s.window_metrics().items()
    ] + [
        (name, fmt_num(value), "", f"last {phase.replace('_', ' ')}")
        for phase, metrics in s.evaluation_metrics().items()
        for name, value in metrics.items()
    ]
    body = "".join("<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    head = "<tr><th>metric</th><th>last</th><th>mean</th><th>from</th></tr>"
    return f"<table>{head}{body}</table>" if rows else ""


def trace_cell(trace_id: str, span_id: str, links: TraceLinks | None) -> str:
    """A trace id as a table cell: a link into the trace backend where ``TRAINTEL_TRACE_URL`` says."""
    url = links.url(trace_id, span_id) if links is not None else None
    code = f"<code>{_e(trace_id)}</code>"
    return f'<td><a href="{_e(url)}">{code}</a></td>' if url else f"<td>{code}</td>"


def config_table(configs: Sequence[dict[str, Any]], heads: Sequence[str]) -> str:
    """The training configuration of each run (``set_training_config``, the ``TRAINTEL_*``
    settings) side by side, headed by ``heads``; a row highlighted where the runs differ."""
    names = sorted({name for config in configs for name in config})
    if not names:
        return '<p class="none">no configuration recorded (the telemetry_initialization event)</p>'
    head = "<tr><th>setting</th>" + "".join(f"<th>{_e(text)}</th>" for text in heads) + "</tr>"
    rows = []
    for name in names:
        values = [config.get(name) for config in configs]
        differs = any(value != values[0] for value in values)
        cells = "".join(f"<td>{_e('-' if v is None else plain_number(v))}</td>" for v in values)
        rows.append(f"<tr{' class=diff' if differs else ''}><td>{_e(name)}</td>{cells}</tr>")
    return f'<table class="config">{head}{"".join(rows)}</table>'


def page(title: str, sections: Sequence[str]) -> str:
    """A self-contained page: inline style, no script, nothing fetched."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(sections)
        + "</body></html>\n"
    )


def _stalls(report: Report) -> list[str]:
    """Each stall (``traintel._host.stall``'s hang records): who waited, the culprit, its stack."""
    sections = []
    for number, stall in enumerate(report.stalls, 1):
        rows = "".join(f"<tr><td>{_e(label)}</td><td>{_e(text)}</td></tr>" for label, text in stall.rows())
        culprit, stack = stall.culprit_stack()
        code = f"<p>rank {culprit}'s stack (innermost last):</p><pre>{_e(stack)}</pre>" if stack else ""
        sections.append(f"<h2>Stall {number}</h2><table>{rows}</table>{code}")
    return sections


def _across_ranks(report: Report) -> list[str]:
    """The last 20 windows across ranks, as the text report shows them (the heatmap above colours
    iteration time, which a synchronising job makes equal on every rank): the spread of compute
    time before the sync point and of data-loading wait, and the straggler the job named."""
    rows = report.ranks.rows()[-20:]
    if not rows:
        return []
    head = "".join(f"<th>{_e(title.split(' ')[0])} {k}</th>" for _, title in SPREADS for k in _SPREAD_STATS)
    return [
        "<h2>Across ranks, per window (compute time before the sync point, data-loading wait)</h2>",
        f"<table><tr><th>window</th><th>iterations</th><th>ranks</th><th>iteration median</th>{head}"
        f"<th>straggler</th></tr>{''.join(map(_across_row, rows))}</table>",
        *([f'<p class="none">compute time: {_e(UNMARKED_COMPUTE)}</p>'] if unmarked(rows) else []),
    ]


_SPREAD_STATS = ("min", "median", "max")


def _across_row(window: dict[str, Any]) -> str:
    """One window's row of :func:`_across_ranks`."""
    cells = [
        f"{window['window']:,}",
        f"{window['first_iteration']:,}-{window['last_iteration']:,}",
        f"{window['ranks']:,}",
        fmt_s((window["iteration_time"] or {}).get("median")),
        *(fmt_s((window[name] or {}).get(k)) for name, _ in SPREADS for k in _SPREAD_STATS),
    ]
    straggler = f"<td class='warn'>{_e(straggler_text(window))}</td>"
    return "<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in cells) + straggler + "</tr>"


def render_html(report: Report, links: TraceLinks | None = None) -> str:
    s = report.summary
    title = f"traintel report · {', '.join(sorted(s.services)) or 'run'}"
    throughput_key = "tokens_per_second" if s.summary_value("tokens_per_second") else "samples_per_second"
    unit = "tokens" if throughput_key.startswith("tokens") else "samples"
    mfu_lines = _series_lines(report, "mfu")
    slowest = _slowest_rows(s, links)
    warnings = "".join(
        f'<li class="warn">{_e(name)}: {fmt_num(count)}</li>' for name, count in report.notices()
    )
    sections = [
        f"<h1>{_e(title)}</h1><p class='sub'>{_e(_identity(report))}</p>",
        f"<table>{_headline_rows(report)}</table>",
        "<h2>Configuration</h2>",
        config_table([report.config], ["value"]),
        "<h2>Timeline</h2>",
        gantt(report),
        f"<h2>Wall time by phase{_e(summed_over(s))}</h2>",  # 80 s of a 43 s job of 2 ranks: said
        f"<table><tr><th>phase</th><th>count</th><th>total</th><th>mean</th><th>share</th></tr>"
        f"{_phase_rows(s)}</table>",
        *_errors(s, links),
        "<h2>Iteration time per window (mean, p99 dashed)</h2>",
        line_chart(_series_lines(report, "time"), "s", "iteration", "iteration-time"),
        f"<h2>Throughput per window ({unit}/s)</h2>",
        line_chart(_series_lines(report, throughput_key), "n", "iteration", "throughput"),
        "<h2>MFU per window</h2>",
        line_chart(mfu_lines, "%", "iteration", "mfu")
        if mfu_lines
        else '<p class="none">no MFU (no peak FLOPs for this device)</p>',
        "<h2>Model metrics per window (mean over the window; hover a point for its last value)</h2>",
        model_metrics(report),
        "<h2>Goodput</h2>",
        waterfall(report),
        "<h2>Checkpoints (blocking time of each save)</h2>",
        checkpoint_chart(report),
        "<h2>Iteration time by rank</h2>",
        heatmap(report),
        *_across_ranks(report),
        *_stalls(report),
        "<h2>Slowest exported iterations</h2>",
        f"<table><tr><th>iteration</th><th>time</th><th>trace id</th><th>span id</th></tr>{slowest}</table>"
        if slowest
        else '<p class="none">none exported</p>',
        "<h2>Warnings</h2>",
        f"<ul>{warnings}</ul>" if warnings else '<p class="none">none</p>',
    ]
    return page(title, sections)


def _identity(report: Report) -> str:
    s = report.summary
    return (
        f"run {', '.join(sorted(s.run_ids)) or '-'} · session {', '.join(sorted(s.session_tags)) or '-'}"
        f" · perf tag {', '.join(sorted(report.perf_tags)) or '-'} · ranks "
        f"{', '.join(map(str, sorted(s.ranks))) or '-'} · hosts {', '.join(sorted(s.hosts)) or '-'}"
    )


def _phase_rows(s: RunSummary) -> str:
    rows = phase_rows(s)
    note = sampled_note(s, rows)
    return "".join(
        f"<tr><td>{_e(r.shown)}</td><td>{r.count:,}</td>"
        f"<td>{_e(fmt_s(r.total_s))}</td><td>{_e(fmt_s(r.mean_s))}</td><td>{_e(fmt_pct(r.share))}</td></tr>"
        for r in rows
    ) + (f'<tr><td colspan="5" class="none">{_e(note)}</td></tr>' if note else "")


def _headline_rows(report: Report) -> str:
    """The run's headline figures: iterations, iteration time, throughput, MFU, energy."""
    s = report.summary
    value = s.summary_value
    headline = [
        *([("figures of", f"the latest of {s.jobs} jobs")] if s.jobs > 1 else []),
        ("iterations", fmt_num(s.iteration_count())),
        (
            "iteration time mean / p99",
            f"{iteration_mean(report)} / {fmt_s(value('iteration_time.p99'))}",
        ),
        ("samples/s (job)", fmt_num(value("samples_per_second"))),
        ("tokens/s (job)", fmt_num(value("tokens_per_second"))),
        ("TFLOP/s per device", fmt_num(value("tflops_per_device"))),
        ("MFU", fmt_pct(value("mfu"))),
    ]
    energy = energy_figures(value)
    if energy is not None:
        headline.append(("GPU energy", energy_text(energy).removeprefix("GPU energy: ")))
    return "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in headline)


def _errors(s: RunSummary, links: TraceLinks | None) -> list[str]:
    """The errors the spans ended with, each where it first happened (none: no section)."""
    if not s.failures:
        return []
    rows = "".join(
        f'<tr><td class="warn">{_e(f.message)}</td><td>{_e(f.where(s))}</td>'
        f"<td>{_e(utc_text(f.end_ns))}</td><td>{f.spans:,}</td>"
        f"{trace_cell(f.trace_id, f.span_id, links)}</tr>"
        for f in s.failures.values()
    )
    more = f" ({s.other_failures:,} more spans with other errors)" if s.other_failures else ""
    return [
        f"<h2>Errors, earliest first, each where it first happened{_e(more)}</h2>",
        "<table><tr><th>error</th><th>in</th><th>at (UTC)</th><th>spans</th><th>trace id</th></tr>"
        f"{rows}</table>",
    ]


def _slowest_rows(s: RunSummary, links: TraceLinks | None) -> str:
    return "".join(
        f"<tr><td>{_e(slow.where(s).removeprefix('iteration '))}</td>"
        f"<td>{_e(fmt_s(slow.seconds))}</td>{trace_cell(slow.trace_id, slow.span_id, links)}"
        f"<td><code>{_e(slow.span_id)}</code></td></tr>"
        for slow in sorted(s.slowest, reverse=True)
    )
