"""``traintel compare --html``: several runs on one page, their curves overlaid.

What a W&B or TensorBoard user looks for first: a table of the runs (when, how long, how far,
with which settings, how well) and each curve of every run on one chart against the iteration
number. Drawn with the same hand-written SVG as ``report --html`` (see there why: one
self-contained page, no script, nothing fetched when it is opened): line charts over at most a
few hundred points per run need no charting library, and the page stays a few dozen kB.
"""

from __future__ import annotations

from collections.abc import Callable

from traintel.analysis.compare import Comparison, Difference, goodput_of, letter
from traintel.analysis.links import TraceLinks
from traintel.analysis.report import Process, Report, WindowPoint
from traintel.analysis.report_html import (
    _PALETTE,
    _W,
    ChartLine,
    _e,
    _svg,
    _text,
    config_table,
    line_chart,
    metric_line,
    page,
    trace_cell,
    window_line,
)
from traintel.analysis.report_text import fmt_num, fmt_pct, fmt_s, fmt_unit
from traintel.analysis.run_info import utc_text
from traintel.semconv import BADPUT_CATEGORIES


def _reference(report: Report) -> Process | None:
    """The process whose curves stand for the run: its lowest rank (every rank runs the same
    iterations; the report's heatmap shows them apart)."""
    ordered = sorted(report.processes.values(), key=lambda p: (p.rank, p.key))
    return next((p for p in ordered if p.timing() or p.series.all() or p.metrics), None)


def _lines(
    reports: list[Report], line_of: Callable[[Process, str, str], ChartLine | None]
) -> list[ChartLine]:
    """Each run's line, ``line_of(process, label, colour)`` of the process that stands for it."""
    lines = []
    for n, report in enumerate(reports):
        process = _reference(report)
        line = line_of(process, letter(n), _PALETTE[n % len(_PALETTE)]) if process is not None else None
        if line is not None and line.points:
            lines.append(line)
    return lines


def _window_lines(
    reports: list[Report],
    points: Callable[[Process], list[WindowPoint]],
    value: Callable[[WindowPoint], float | None],
    unit: str,
) -> list[ChartLine]:
    def line_of(process: Process, label: str, colour: str) -> ChartLine:
        return window_line(label, colour, points(process), value, lambda y: fmt_unit(y, unit))

    return _lines(reports, line_of)


def _metric_lines(reports: list[Report], name: str) -> list[ChartLine]:
    def line_of(process: Process, label: str, colour: str) -> ChartLine | None:
        series = process.metrics.get(name)
        return metric_line(label, colour, name, series.all()) if series is not None else None

    return _lines(reports, line_of)


def run_table(reports: list[Report], names: list[str], comparison: Comparison) -> str:
    """One row per run: who, when, how long, how far, goodput, MFU, and the settings that differ."""
    differing = comparison.config_differences
    head = "<tr><th>run</th><th>start (UTC)</th><th>duration</th><th>iterations</th><th>ended</th>"
    head += "<th>goodput</th><th>MFU</th>"
    head += "<th>settings that differ</th></tr>"
    rows = []
    for n, (report, name) in enumerate(zip(reports, names, strict=True)):
        data = report.as_dict()
        settings = (
            "; ".join(f"{key} = {fmt_num(values[n])}" for key, values in differing.items()) or "same as A"
        )
        colour = _PALETTE[n % len(_PALETTE)]
        rows.append(
            f'<tr><td class="name"><b style="color:{colour}">{letter(n)}</b> {_e(name)}</td>'
            f'<td class="when">{utc_text(report.start_ns) if report.start_ns else "-"}</td>'
            f"<td>{_e(fmt_s(report.duration_s))}</td><td>{_e(fmt_num(data['iterations']['count']))}</td>"
            f"<td>{_e(comparison.endings[n] or '-')}</td>"
            f"<td>{_e(fmt_pct(goodput_of(data)))}</td><td>{_e(fmt_pct(data['throughput']['mfu']))}</td>"
            f'<td class="{"diff" if differing else ""}">{_e(settings)}</td></tr>'
        )
    return f'<table class="runs">{head}{"".join(rows)}</table>'


def _cell(d: Difference, n: int) -> str:
    shown = fmt_unit(d.values[n], d.unit)
    change = d.changes[n]
    if n == 0 or change is None:
        return f"<td>{_e(shown)}</td>"
    title = f"{100 * change:+.1f}% against A" + (f": {d.verdicts[n]}" if d.verdicts[n] else "")
    verdict = f' class="{d.verdicts[n]}"' if d.verdicts[n] else ""
    return f'<td{verdict} title="{_e(title)}">{_e(shown)} <small>({100 * change:+.1f}%)</small></td>'


def differences_table(comparison: Comparison, runs: int) -> str:
    """Every metric, each run's value with its change against A; worse in red, better in green."""
    head = "<tr><th>metric</th>" + "".join(f"<th>{letter(n)}</th>" for n in range(runs)) + "</tr>"
    rows = [
        f"<tr><td>{_e(d.metric)}</td>" + "".join(_cell(d, n) for n in range(runs)) + "</tr>"
        for d in comparison.differences
        if any(v is not None for v in d.values)
    ]
    return f"<p>{_e(comparison.significant())}</p><table>{head}{''.join(rows)}</table>"


def goodput_bars(reports: list[Report]) -> str:
    """One stacked bar per run: productive time, then each badput category, as shares of its
    wall time (runs of different lengths compare by share)."""
    categories = [
        c for c in BADPUT_CATEGORIES if any(s.badput_s.get(c, 0.0) > 0 for r in reports for s in r.goodput)
    ]
    others = [colour for colour in _PALETTE if colour != "#59a14f"]  # green is productive's alone
    colours = {"productive": "#59a14f"} | {c: others[i % len(others)] for i, c in enumerate(categories)}
    label_w, bar_h = 60, 22
    height = 10 + bar_h * len(reports) + 30
    scale = _W - label_w - 20
    parts = [_svg("goodput", height)]
    for n, report in enumerate(reports):
        y = 10 + n * bar_h
        total = sum(s.total_s for s in report.goodput)
        parts.append(_text(label_w - 8, y + 15, letter(n), 11, "end", bold=True))
        if total <= 0:
            parts.append(_text(label_w, y + 15, "no goodput data"))
            continue
        x = float(label_w)
        shares = [("productive", sum(s.productive_s for s in report.goodput))]
        shares += [(c, sum(s.badput_s.get(c, 0.0) for s in report.goodput)) for c in categories]
        for name, seconds in shares:
            width = scale * seconds / total
            if width <= 0:
                continue
            tip = f"{letter(n)} {name}: {fmt_s(seconds)} ({fmt_pct(seconds / total)})"
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{y + 2}" width="{width:.1f}" height="{bar_h - 4}" '
                f'fill="{colours[name]}"><title>{_e(tip)}</title></rect>'
            )
            x += width
    parts.append("</svg>")
    legend = "".join(f'<span><i style="background:{colours[c]}"></i>{_e(c)}</span>' for c in colours)
    return "".join(parts) + f'<div class="legend">{legend}</div>'


def _slowest(reports: list[Report], links: TraceLinks | None) -> str:
    rows = [
        f"<tr><td>{letter(n)}</td><td>{it:,}</td><td>{_e(fmt_s(sec))}</td>{trace_cell(t, sp, links)}</tr>"
        for n, report in enumerate(reports)
        for sec, t, sp, it, *_where in sorted(report.summary.slowest, reverse=True)[:3]
    ]
    if not rows:
        return '<p class="none">none exported</p>'
    return (
        "<table><tr><th>run</th><th>iteration</th><th>time</th><th>trace id</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def render_compare_html(
    reports: list[Report], names: list[str], comparison: Comparison, links: TraceLinks | None = None
) -> str:
    """The page: the runs, the differences, the curves of every run overlaid, the configurations."""
    unit = "tokens" if any(r.summary.summary_value("tokens_per_second") for r in reports) else "samples"
    legend = " · ".join(f"{letter(n)} = {name}" for n, name in enumerate(names))
    windows = [
        ("Iteration time per window (mean)", "s", Process.timing, lambda p: p.mean_s),
        (
            f"Throughput per window ({unit}/s)",
            "n",
            lambda p: p.series.all(),
            lambda p: getattr(p, unit + "_per_second"),
        ),
        ("MFU per window", "%", Process.timing, lambda p: p.mfu),
    ]
    curves = [(title, y, _window_lines(reports, of, value, y), True) for title, y, of, value in windows]
    names_of_metrics = sorted({name for r in reports for name in r.model_metric_names()})
    curves += [
        (f"{name} (mean per window)", "n", _metric_lines(reports, name), False) for name in names_of_metrics
    ]
    sections = [
        f"<h1>traintel compare · {len(reports)} runs</h1><p class='sub'>{_e(legend)}</p>",
        "<h2>Runs</h2>",
        run_table(reports, names, comparison),
        "<h2>Differences against A</h2>",
        differences_table(comparison, len(reports)),
    ]
    for note in (comparison.perf_tags_note(), comparison.not_completed()):
        if note:
            sections.append(f'<p class="warn">{_e(note)}</p>')
    for i, (title, fmt, lines, zero_based) in enumerate(curves):
        if not lines:
            continue
        sections.append(f"<h2>{_e(title)}</h2>")
        sections.append(line_chart(lines, fmt, "iteration", f"curve-{i}", zero_based=zero_based))
    sections += ["<h2>Goodput (share of wall time)</h2>", goodput_bars(reports)]
    sections += ["<h2>Slowest exported iterations</h2>", _slowest(reports, links)]
    configs = config_table([r.config for r in reports], [letter(n) for n in range(len(reports))])
    sections += ["<h2>Configuration (settings that differ highlighted)</h2>", configs]
    return page(f"traintel compare · {len(reports)} runs", sections)
