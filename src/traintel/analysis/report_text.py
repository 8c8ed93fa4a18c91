"""``traintel report`` for a terminal: rich tables, badput as bars.

Rendering is separate from gathering (:mod:`traintel.analysis.report`) so the JSON and HTML
views show exactly the same numbers.
"""

from __future__ import annotations

import io
import math
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from traintel.analysis.report import Report
from traintel.analysis.summary import is_loss, phase_rows
from traintel.semconv import BADPUT_CATEGORIES


def fmt_s(seconds: float | None) -> str:
    if seconds is None or not isinstance(seconds, int | float) or math.isnan(seconds) or math.isinf(seconds):
        return "-"
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if abs(seconds) < 1:
        return f"{seconds * 1e3:.2f} ms"
    if abs(seconds) < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"


def fmt_num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def fmt_pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f}%"


def bar(share: float, width: int = 24) -> str:
    filled = max(0.0, min(1.0, share)) * width
    full = int(filled)
    return "█" * full + ("▌" if filled - full >= 0.5 else "")


def _table(title: str, *columns: str) -> Table:
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        title_style="bold",
        show_header=any(columns),
    )
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    return table


def renderables(report: Report) -> list[RenderableType]:
    """The report's tables, in reading order; sections with nothing to show are left out."""
    sections = (
        _run_table(report),
        _phase_table(report),
        _throughput_table(report),
        _checkpoint_table(report),
        *_goodput_tables(report),
        _slowest_table(report),
        _ranks_table(report),
        _warnings_table(report),
    )
    return [section for section in sections if section is not None]


def _run_table(report: Report) -> Table:
    s = report.summary
    ident = _table("Run", "", "")
    ident.add_row("service", ", ".join(sorted(s.services)) or "-")
    ident.add_row("run id", ", ".join(sorted(s.run_ids)) or "-")
    ident.add_row("session tag", ", ".join(sorted(s.session_tags)) or "-")
    ident.add_row("perf tag", ", ".join(sorted(report.perf_tags)) or "-")
    ident.add_row("ranks", ", ".join(str(r) for r in sorted(s.ranks)) or "-")
    ident.add_row("hosts", ", ".join(sorted(s.hosts)) or "-")
    ident.add_row("input", f"{len(report.files)} file(s), {s.spans:,} spans")
    if report.stats.skipped:
        ident.add_row(
            Text("skipped", style="yellow"),
            Text(f"{report.stats.skipped} line(s): {'; '.join(report.stats.reasons[:3])}", style="yellow"),
        )
    return ident


def _phase_table(report: Report) -> Table:
    phases = _table("Wall time by phase", "phase", "count", "total", "mean", "max", "share", "", "errors")
    for row in phase_rows(report.summary):
        phases.add_row(
            row.phase,
            fmt_num(row.count),
            fmt_s(row.total_s),
            fmt_s(row.mean_s),
            fmt_s(row.max_s),
            fmt_pct(row.share),
            bar(row.share or 0.0, 16),
            Text(str(row.errors), style="red") if row.errors else "",
        )
    return phases


def _throughput_table(report: Report) -> Table:
    s = report.summary
    value = s.summary_value
    perf = _table("Iterations and throughput (after warm-up)", "", "")
    count = value("iterations") if value("iterations") is not None else s.window_iterations
    perf.add_row("iterations", fmt_num(count))
    perf.add_row("first iteration", fmt_s(value("first_iteration_time")))
    for stat in ("mean", "stddev", "p50", "p90", "p99"):
        perf.add_row(f"iteration time {stat}", fmt_s(value(f"iteration_time.{stat}")))
    perf.add_row("samples/s (job)", fmt_num(value("samples_per_second")))
    perf.add_row("tokens/s (job)", fmt_num(value("tokens_per_second")))
    perf.add_row("TFLOP/s per device", fmt_num(value("tflops_per_device")))
    mfu, hfu = value("mfu"), value("hfu")
    perf.add_row("MFU", fmt_pct(mfu) if mfu is not None else "- (no peak FLOPs for this device)")
    if hfu is not None:
        perf.add_row("HFU", fmt_pct(hfu))
    return perf


def _checkpoint_table(report: Report) -> Table | None:
    if not (report.saves or report.stage_s):
        return None
    data = report.as_dict()["checkpoints"]
    ckpt = _table("Checkpoints (blocking time)", "", "")
    ckpt.add_row("saves", fmt_num(data["saves"]))
    ckpt.add_row("total", fmt_s(data["save_time_total_s"]))
    ckpt.add_row("mean", fmt_s(data["save_time_mean_s"]))
    ckpt.add_row("max", fmt_s(data["save_time_max_s"]))
    if data["bytes_total"]:
        ckpt.add_row("bytes written", f"{data['bytes_total'] / 1e6:,.2f} MB")
    ckpt.add_row("loads", fmt_num(data["loads"]))
    for stage, seconds in sorted(report.stage_s.items()):
        ckpt.add_row(f"stage {stage}", fmt_s(seconds))
    return ckpt


def _goodput_tables(report: Report) -> list[Table]:
    tables = []
    for session in report.goodput:
        tags = ", ".join(t for t in session.perf_tags if t)
        title = f"Goodput · session {session.session or '-'}" + (f" · perf tag {tags}" if tags else "")
        table = _table(title, "category", "time", "share", "")
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


def _slowest_table(report: Report) -> Table | None:
    if not report.summary.slowest:
        return None
    slow = _table(
        "Slowest exported iterations (open in Jaeger/Tempo by id)",
        "iteration",
        "time",
        "trace id",
        "span id",
    )
    for seconds, trace_id, span_id, iteration in sorted(report.summary.slowest, reverse=True):
        slow.add_row(str(iteration), fmt_s(seconds), trace_id, span_id)
    return slow


def _ranks_table(report: Report) -> Table | None:
    cross = report.ranks.rows()
    if not cross:
        return None
    ranks = _table(
        "Across ranks, per window (p99 and top-k: --json)",
        "window",
        "ranks",
        "iteration min · median · max",
        "compute before sync min · median · max",
        "straggler",
    )
    for window in cross[-20:]:
        spans = [
            " · ".join(fmt_s(stats.get(k)) for k in ("min", "median", "max")) if stats else "-"
            for stats in (window["iteration_time"], window["compute_time"])
        ]
        straggler = window["straggler_rank"]
        ranks.add_row(
            f"{window['window']} (it. {window['first_iteration']}-{window['last_iteration']})",
            str(window["ranks"]),
            *spans,
            Text(f"rank {straggler}", style="yellow") if straggler is not None else "",
        )
    return ranks


def _warnings_table(report: Report) -> Table:
    notes = _table("Warnings", "", "")
    for name, n in sorted(report.warnings.items()):
        notes.add_row(Text(name, style="yellow"), fmt_num(n))
    for name, total in report.self_telemetry.items():
        if total and is_loss(name):
            notes.add_row(Text(name, style="yellow"), fmt_num(total))
    if report.stats.skipped:
        notes.add_row(Text("unreadable lines skipped", style="yellow"), fmt_num(report.stats.skipped))
    if notes.row_count == 0:
        notes.add_row("none", "")
    return notes


def render_text(report: Report, width: int = 110, color: bool = False) -> str:
    """The report as text (no colour unless asked), e.g. for tests or a pipe."""
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=width, color_system="standard" if color else None, force_terminal=color
    )
    console.print(Group(*renderables(report)))
    return buffer.getvalue()
