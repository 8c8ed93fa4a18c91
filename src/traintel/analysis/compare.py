"""``traintel compare``: two runs side by side, significant differences flagged.

The perf_tag use case of the reference library: runs with the same perf_tag should perform the
same, so a difference beyond the threshold is a regression (or a win) worth a look. Each metric
knows which direction is better, so a flag says "worse" or "better", not just "changed".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traintel.analysis.report import Report

#: (label, key in the report's JSON, higher is better, kind)
_METRICS: tuple[tuple[str, str, str, bool, str], ...] = (
    ("iteration time mean", "iterations", "mean_s", False, "s"),
    ("iteration time p50", "iterations", "p50_s", False, "s"),
    ("iteration time p99", "iterations", "p99_s", False, "s"),
    ("first iteration", "iterations", "first_s", False, "s"),
    ("samples/s", "throughput", "samples_per_second", True, "n"),
    ("tokens/s", "throughput", "tokens_per_second", True, "n"),
    ("TFLOP/s per device", "throughput", "tflops_per_device", True, "n"),
    ("MFU", "throughput", "mfu", True, "%"),
    ("checkpoint save mean", "checkpoints", "save_time_mean_s", False, "s"),
    ("checkpoint save max", "checkpoints", "save_time_max_s", False, "s"),
)


@dataclass(frozen=True)
class Difference:
    metric: str
    a: float | None
    b: float | None
    change: float | None  # (b - a) / a
    verdict: str  # "", "better", "worse"
    unit: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "a": self.a,
            "b": self.b,
            "change": self.change,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Comparison:
    perf_tags: tuple[list[str], list[str]]
    differences: list[Difference]
    threshold: float

    @property
    def perf_tags_match(self) -> bool:
        return self.perf_tags[0] == self.perf_tags[1]

    @property
    def regressions(self) -> list[Difference]:
        return [d for d in self.differences if d.verdict == "worse"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "perf_tags": {"a": self.perf_tags[0], "b": self.perf_tags[1], "match": self.perf_tags_match},
            "threshold": self.threshold,
            "differences": [d.as_dict() for d in self.differences],
            "regressions": [d.metric for d in self.regressions],
        }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _goodput(data: dict[str, Any]) -> float | None:
    sessions = data.get("goodput") or []
    total = sum(s.get("total_seconds", 0.0) for s in sessions)
    productive = sum(s.get("productive_seconds", 0.0) for s in sessions)
    return productive / total if total > 0 else None


def compare(a: Report, b: Report, threshold: float = 0.05) -> Comparison:
    """Differences of B against A; a relative change of at least ``threshold`` is flagged."""
    if not threshold > 0:
        raise ValueError(f"compare threshold must be > 0, got {threshold!r}")
    da, db = a.as_dict(), b.as_dict()
    rows: list[tuple[str, float | None, float | None, bool, str]] = [
        (label, _number(da[section].get(key)), _number(db[section].get(key)), higher, unit)
        for label, section, key, higher, unit in _METRICS
    ]
    rows.append(("goodput", _goodput(da), _goodput(db), True, "%"))
    differences = []
    for label, va, vb, higher_is_better, unit in rows:
        change = (vb - va) / abs(va) if va is not None and vb is not None and va != 0 else None
        verdict = ""
        if change is not None and abs(change) >= threshold:
            verdict = "better" if (change > 0) == higher_is_better else "worse"
        differences.append(Difference(label, va, vb, change, verdict, unit))
    return Comparison((da["identity"]["perf_tags"], db["identity"]["perf_tags"]), differences, threshold)


def render_comparison(comparison: Comparison, name_a: str, name_b: str) -> list[Any]:
    """Rich renderables for the terminal."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from traintel.analysis.report_text import fmt_num, fmt_pct, fmt_s

    def fmt(value: float | None, unit: str) -> str:
        return fmt_s(value) if unit == "s" else fmt_pct(value) if unit == "%" else fmt_num(value)

    # A and B above the table, not as its title: a title wraps to the table's width, which would
    # break a long path or run id at 80 columns.
    names = Text(f"A = {name_a}\nB = {name_b}", style="bold")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column in ("metric", "A", "B", "change", ""):
        table.add_column(column, justify="left" if column == "metric" else "right", no_wrap=True)
    for d in comparison.differences:
        change = "-" if d.change is None else f"{100 * d.change:+.1f}%"
        style = {"worse": "red", "better": "green"}.get(d.verdict, "")
        table.add_row(d.metric, fmt(d.a, d.unit), fmt(d.b, d.unit), change, Text(d.verdict, style=style))
    out: list[Any] = [names, table]
    a_tags, b_tags = comparison.perf_tags
    if not comparison.perf_tags_match:
        out.append(
            Text(
                f"perf tags differ (A: {', '.join(a_tags) or '-'}; B: {', '.join(b_tags) or '-'}): "
                "these runs may not be meant to perform alike",
                style="yellow",
            )
        )
    flagged = [d.metric for d in comparison.differences if d.verdict]
    out.append(
        Text(
            f"{len(flagged)} significant difference(s) at ±{100 * comparison.threshold:g}%"
            + (f": {', '.join(flagged)}" if flagged else "")
        )
    )
    return out
