"""``traintel report`` for a terminal: rich tables, badput as bars.

Rendering is separate from gathering (:mod:`traintel.analysis.report`) so the JSON and HTML
views show exactly the same numbers.

Why the layout depends on the width: reports are read in 80-column terminals, pipes and CI logs
as much as in wide terminals, and a table wider than its console gets its names cut
(``trainin…``) and its numbers wrapped. Every table fits 80 columns for the usual names and
numbers; the decorative bars are added only where there is room. Numbers are plain (grouped
integers, fixed decimals with units), never scientific notation.
"""

from __future__ import annotations

import io
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from traintel.analysis.goodput import SessionGoodput
from traintel.analysis.links import TraceLinks
from traintel.analysis.ranks import SPREADS, UNMARKED_COMPUTE, straggler_text, unmarked
from traintel.analysis.report import Report
from traintel.analysis.run_info import utc_text
from traintel.analysis.summary import (
    energy_figures,
    energy_text,
    fmt_seconds,
    phase_rows,
    plain_number,
    sampled_note,
    summed_over,
)
from traintel.semconv import BADPUT_CATEGORIES, WINDOW_PREFIX

_W = WINDOW_PREFIX

#: Consoles at least this wide get the phase table's share bars.
WIDE = 100

#: Durations: µs, ms, s, min, h with fixed decimals; counts and rates: ``21,323``, ``0.1234``,
#: ``-`` where there is none (shared with the summary).
fmt_s, fmt_num = fmt_seconds, plain_number


def fmt_pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f}%"


def fmt_unit(value: float | None, unit: str) -> str:
    """A value in its unit: ``s`` a duration, ``%`` a share, else a plain number."""
    return fmt_s(value) if unit == "s" else fmt_pct(value) if unit == "%" else fmt_num(value)


def bar(share: float, width: int = 24) -> str:
    filled = max(0.0, min(1.0, share)) * width
    full = int(filled)
    return "█" * full + ("▌" if filled - full >= 0.5 else "")


def _table(title: str, *columns: str, values_left: bool = False) -> Table:
    """A table of the report: the first column (names) left, the others right unless
    ``values_left``. Compact padding, so a table of names and numbers fits 80 columns."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        title_style="bold",
        show_header=any(columns),
        pad_edge=False,
        collapse_padding=True,
        min_width=len(title),  # a title is not wrapped to a narrow table's width
    )
    for i, column in enumerate(columns):
        left = i == 0 or values_left
        table.add_column(column, justify="left" if left else "right", no_wrap=True)
    return table


def renderables(report: Report, width: int = 110) -> list[RenderableType]:
    """The report's tables for a console ``width`` columns wide, in reading order; sections with
    nothing to show are left out."""
    sections = (
        _run_table(report),
        _phase_table(report, width),
        _errors_table(report),
        _throughput_table(report),
        _model_metrics_table(report),
        _checkpoint_table(report),
        *_goodput_tables(report),
        _slowest_table(report),
        *_ranks_tables(report),
        *_stall_sections(report),
        _warnings_table(report),
    )
    return [section for section in sections if section is not None]


def _run_table(report: Report) -> Table:
    s = report.summary
    ident = _table("Run", "", "", values_left=True)
    ident.columns[1].no_wrap = False  # several run ids or hosts may wrap, between them
    ident.add_row("service", ", ".join(sorted(s.services)) or "-")
    ident.add_row("run id", ", ".join(sorted(s.run_ids)) or "-")
    ident.add_row("session tag", ", ".join(sorted(s.session_tags)) or "-")
    ident.add_row("perf tag", ", ".join(sorted(report.perf_tags)) or "-")
    ident.add_row("ranks", ", ".join(str(r) for r in sorted(s.ranks)) or "-")
    ident.add_row("hosts", ", ".join(sorted(s.hosts)) or "-")
    ident.add_row("input", f"{len(report.files):,} file(s), {s.spans:,} spans")
    if report.stats.skipped:
        ident.add_row(
            Text("skipped", style="yellow"),
            Text(f"{report.stats.skipped} line(s): {'; '.join(report.stats.reasons[:3])}", style="yellow"),
        )
    return ident


def _phase_table(report: Report, width: int) -> Table:
    """Wall time by phase; the share bars and the errors column only where they add something
    (a wide console; a run with errors), so the names and numbers keep their room."""
    rows = phase_rows(report.summary)
    bars, errors = width >= WIDE, any(row.errors for row in rows)
    title = "Wall time by phase" + summed_over(report.summary)
    columns = ["phase", "count", "total", "mean", "max", "share"]
    phases = _table(title, *columns, *([""] if bars else []), *(["errors"] if errors else []))
    for row in rows:
        cells: list[str | Text] = [
            row.shown,
            fmt_num(row.count),
            fmt_s(row.total_s),
            fmt_s(row.mean_s),
            fmt_s(row.max_s),
            fmt_pct(row.share),
        ]
        if bars:
            cells.append(bar(row.share or 0.0, 16))
        if errors:
            cells.append(Text(fmt_num(row.errors), style="red") if row.errors else "")
        phases.add_row(*cells)
    phases.caption = sampled_note(report.summary, rows)
    return phases


def _throughput_table(report: Report) -> Table:
    s = report.summary
    value = s.summary_value
    latest = f"the latest of {s.jobs} jobs; " if s.jobs > 1 else ""
    perf = _table(f"Iterations and throughput ({latest}times and rates after warm-up)", "", "")
    perf.add_row("iterations", fmt_num(s.iteration_count()))
    perf.add_row("first iteration", fmt_s(value("first_iteration_time")))
    perf.add_row("iteration time mean", iteration_mean(report))
    for stat in ("stddev", "p50", "p90", "p99"):
        perf.add_row(f"iteration time {stat}", fmt_s(value(f"iteration_time.{stat}")))
    perf.add_row("samples/s (job)", fmt_num(value("samples_per_second")))
    perf.add_row("tokens/s (job)", fmt_num(value("tokens_per_second")))
    perf.add_row("TFLOP/s per device", fmt_num(value("tflops_per_device")))
    mfu, hfu = value("mfu"), value("hfu")
    perf.add_row("MFU", fmt_pct(mfu) if mfu is not None else "- (no peak FLOPs for this device)")
    if hfu is not None:
        perf.add_row("HFU", fmt_pct(hfu))
    measured = value("mfu_measured")
    if measured is not None:
        perf.add_row("MFU (measured matmul peak)", fmt_pct(measured))
    energy = energy_figures(value)
    if energy is not None:
        perf.add_row("GPU energy", energy_text(energy).removeprefix("GPU energy: "))
    return perf


def iteration_mean(report: Report) -> str:
    """The loop's mean iteration time; where the loop left no end-of-loop figures (killed, or
    still running) the mean over its windows, said so, the number ``--json`` gives as
    ``iterations.mean_s`` (a "-" here beside it read as no iteration measured)."""
    s = report.summary
    mean = s.summary_value("iteration_time.mean")
    if mean is not None or not s.window_iterations:
        return fmt_s(mean)
    return f"{fmt_s(s.window_iteration_s / s.window_iterations)} (windows)"


def _checkpoint_table(report: Report) -> Table | None:
    if not (report.saves or report.stage_s):
        return None
    data = report.checkpoints()
    # every save of every rank and job, as the phase table: the summary's line is one loop's
    ckpt = _table("Checkpoints (blocking time)" + summed_over(report.summary), "", "")
    ckpt.add_row("saves", _with_failed(data["saves"], data["failed_saves"]))
    ckpt.add_row("total", fmt_s(data["save_time_total_s"]))
    ckpt.add_row("mean", fmt_s(data["save_time_mean_s"]))
    ckpt.add_row("max", fmt_s(data["save_time_max_s"]))
    if data["bytes_total"]:
        ckpt.add_row("bytes written", f"{data['bytes_total'] / 1e6:,.2f} MB")
    ckpt.add_row("loads", _with_failed(data["loads"], data["failed_loads"]))
    for stage, seconds in report.stage_rows():
        ckpt.add_row(f"stage {stage}", fmt_s(seconds))
    return ckpt


def _with_failed(count: int, failed: int) -> str:
    """``"5 (3 failed)"``; ``"5"`` when none failed."""
    return fmt_num(count) + (f" ({failed:,} failed)" if failed else "")


def _goodput_tables(report: Report) -> list[Table]:
    tables = []
    for session in report.goodput:
        table = _table(_goodput_title(session), "category", "time", "share", "")
        table.add_row(
            Text("productive", style="green"),
            fmt_s(session.productive_s),
            fmt_pct(session.goodput),
            Text(bar(session.goodput), style="green"),
        )
        for category in BADPUT_CATEGORIES:
            seconds = session.badput_s.get(category, 0.0)
            if seconds > 0:
                share = session.badput(category)
                table.add_row(category, fmt_s(seconds), fmt_pct(share), Text(bar(share), style="red"))
        table.add_row("total", fmt_s(session.total_s), "100.0%", "")
        tables.append(table)
    return tables


def _goodput_title(session: SessionGoodput) -> str:
    """The session, its perf tags, and the rank of each job counted (said: the phase table
    above it is summed over every rank)."""
    tags = ", ".join(t for t in session.perf_tags if t)
    title = f"Goodput · session {session.session or '-'}" + (f" · perf tag {tags}" if tags else "")
    used = sorted({job.rank_used for job in session.jobs if len(job.ranks) > 1})
    return title + (f" · rank {', '.join(map(str, used))} of each job" if used else "")


def trace_links(report: Report, links: TraceLinks | None) -> list[str]:
    """Each slowest exported iteration's link into the trace backend (``TRAINTEL_TRACE_URL``):
    printed whole after the tables, as a URL in a table cell would be cut at the width."""
    found = []
    for slow in sorted(report.summary.slowest, reverse=True):
        url = links.url(slow.trace_id, slow.span_id) if links is not None else None
        if url:
            found.append(f"{slow.where(report.summary)} in the trace backend: {url}")
    return found


def _errors_table(report: Report) -> Table | None:
    """Each error the spans ended with, where it first happened (the innermost span) and its
    trace: the first thing to read after a crash."""
    summary = report.summary
    if not summary.failures:
        return None
    more = f"; {summary.other_failures} more spans with other errors" if summary.other_failures else ""
    table = _table(f"Errors, earliest first, each where it first happened{more}", "")
    for failure in summary.failures.values():
        around = f", {failure.spans} spans with it" if failure.spans > 1 else ""
        text = Text(failure.message, style="red")
        text.append(f"\n  in {failure.where(summary)} at {utc_text(failure.end_ns)} UTC{around}", style="")
        text.append(f"\n  trace {failure.trace_id} span {failure.span_id}", style="")
        table.add_row(text)
    table.columns[0].no_wrap = False  # a long message wraps rather than being cut
    return table


def _slowest_table(report: Report) -> Table | None:
    if not report.summary.slowest:
        return None
    several = len(report.summary.ranks) > 1
    columns = ("iteration", *(("rank",) if several else ()), "time", "trace id", "span id")
    jobs = ", of every job (their run ids: --json)" if report.summary.jobs > 1 else ""
    table = _table(f"Slowest exported iterations{jobs} (open in Jaeger/Tempo by id)", *columns)
    for slow in sorted(report.summary.slowest, reverse=True):
        rank = (str(slow.rank),) if several else ()
        table.add_row(str(slow.iteration), *rank, fmt_s(slow.seconds), slow.trace_id, slow.span_id)
    return table


def _ranks_tables(report: Report) -> list[Table]:
    """The ranks' mean iteration time per window, and where the live exchange recorded them,
    their compute time before the synchronisation point and their data-loading wait (a rank whose
    input pipeline lags waits for data, not in the collective): one statistic per column, so
    each table fits 80."""
    rows = report.ranks.rows()
    cross = rows[-20:]
    if not cross:
        return []
    ranks = _table(
        "Across ranks, per window: mean iteration time (p99, top-k: --json)",
        "window", "iterations", "ranks", "min", "median", "max", "straggler",
    )  # fmt: skip
    if len(rows) > len(cross):  # said: a table of 20 read as the whole run's
        ranks.caption = f"the last {len(cross)} of {len(rows):,} windows (each: --json)"
    for window in cross:
        straggler = straggler_text(window)
        ranks.add_row(
            *_window_cells(window),
            fmt_num(window["ranks"]),
            *_min_median_max(window["iteration_time"]),
            Text(straggler, style="yellow") if straggler else "",
        )
    return [ranks, *_spread_tables(cross)]


def _window_cells(window: dict[str, Any]) -> tuple[str, str]:
    """A window's index and iteration range, as the tables across ranks start their rows."""
    first, last = fmt_num(window["first_iteration"]), fmt_num(window["last_iteration"])
    return fmt_num(window["window"]), f"{first}-{last}"


def _spread_tables(cross: list[dict[str, Any]]) -> list[Table]:
    """A table per spread across ranks (:data:`SPREADS`) the windows recorded, the compute
    time's saying how it was measured where no sync point was marked."""
    tables = []
    for name, title in SPREADS:
        table = _table(f"Across ranks, per window: {title}", "window", "iterations", "min", "median", "max")
        for window in cross:
            if window[name]:
                table.add_row(*_window_cells(window), *_min_median_max(window[name]))
        if name == "compute_time" and unmarked(cross):
            table.caption = UNMARKED_COMPUTE
        if table.row_count:
            tables.append(table)
    return tables


def _min_median_max(stats: dict[str, float] | None) -> list[str]:
    return [fmt_s(stats.get(k)) if stats else "-" for k in ("min", "median", "max")]


def _model_metrics_table(report: Report) -> Table | None:
    """The user's model metrics as the run left them: the last window's last value and mean,
    and each evaluation loop's last values (curves per window: ``--html``)."""
    s = report.summary
    window, evaluation = s.window_metrics(), s.evaluation_metrics()
    if not (window or evaluation):
        return None
    first, last = s.last_window.get(_W + "first_iteration"), s.last_window.get(_W + "last_iteration")
    where = "last window" + (f", iterations {fmt_num(first)}-{fmt_num(last)}" if first is not None else "")
    table = _table("Model metrics (per window: --html)", "metric", "last", "mean", "from")
    for name, stats in window.items():
        table.add_row(name, fmt_num(stats.get("last")), fmt_num(stats.get("mean")), where)
    for phase, metrics in evaluation.items():
        for name, value in metrics.items():
            table.add_row(name, fmt_num(value), "", f"last {phase.replace('_', ' ')}")
    table.columns[3].justify = "left"
    return table


def _stall_sections(report: Report) -> list[RenderableType]:
    """Each stall: who waited in which collective, the culprit, where it was and its stack."""
    sections: list[RenderableType] = []
    for number, stall in enumerate(report.stalls, 1):
        table = _table(f"Stall {number}", "", "", values_left=True)
        table.columns[1].no_wrap = False
        for label, text in stall.rows():
            style = {"culprit": "bold red", "no record": "yellow"}.get(label, "")
            table.add_row(Text(label, style=style), text)
        sections.append(table)
        culprit, stack = stall.culprit_stack()
        if stack:
            sections.append(Text(f"rank {culprit}'s stack (innermost last):\n{stack}"))
    return sections


def _warnings_table(report: Report) -> Table:
    notes = _table("Warnings", "", "")
    for name, count in report.notices():
        notes.add_row(Text(name, style="yellow"), fmt_num(count))
    if notes.row_count == 0:
        notes.add_row("none", "")
    return notes


def render_text(report: Report, width: int = 110) -> str:
    """The report as plain text (no colour), e.g. for tests or a pipe."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False)
    console.print(Group(*renderables(report, width)))
    return buffer.getvalue()
