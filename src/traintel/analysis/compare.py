"""``traintel compare``: runs side by side against the first (A), significant differences flagged.

The perf_tag use case of the reference library: runs with the same perf_tag should perform the
same, so a difference beyond the threshold is a regression (or a win) worth a look. Each metric
knows which direction is better, so a flag says "worse" or "better", not just "changed". The
runs' configurations are compared too: a setting that differs is often the reason.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

from traintel.analysis.report import Report

#: (label, section of the report's JSON, key, higher is better (None: neither), unit)
_METRICS: tuple[tuple[str, str, str, bool | None, str], ...] = (
    ("iterations", "iterations", "count", None, "n"),
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


def letter(index: int) -> str:
    """A run's name in tables: A, B, ... Z, then A2, B2, ..."""
    letters = string.ascii_uppercase
    return letters[index % 26] + (str(index // 26 + 1) if index >= 26 else "")


@dataclass(frozen=True)
class Difference:
    """One metric over the runs: each run's value, and each one's change against A's."""

    metric: str
    values: list[float | None]
    changes: list[float | None]  # (run - A) / |A|; None for A itself and where undefined
    verdicts: list[str]  # "", "better", "worse" (A's is always "")
    unit: str

    def as_dict(self) -> dict[str, Any]:
        """A and B, B's change and verdict (the two-run case), and every run's beside them."""
        data: dict[str, Any] = {
            "metric": self.metric,
            "a": self.values[0],
            "b": self.values[1],
            "change": self.changes[1],
            "verdict": self.verdicts[1],
        }
        if len(self.values) > 2:
            data.update(values=self.values, changes=self.changes, verdicts=self.verdicts)
        return data


@dataclass(frozen=True)
class Comparison:
    perf_tags: list[list[str]]
    differences: list[Difference]
    threshold: float
    #: Settings whose values differ between the runs: name -> each run's value (None: unset).
    config_differences: dict[str, list[Any]]
    #: How each run's last job ended: "completed", "failed (KeyboardInterrupt)", ...; None where
    #: its files tell no job's end.
    endings: list[str | None]

    def not_completed(self) -> str | None:
        """The runs that did not complete, as a note ("B failed (KeyboardInterrupt)"): their
        figures are of less work than the others'."""
        ended = [f"{letter(n)} {how}" for n, how in enumerate(self.endings) if how not in (None, "completed")]
        return f"not completed: {'; '.join(ended)}" if ended else None

    @property
    def perf_tags_match(self) -> bool:
        return all(tags == self.perf_tags[0] for tags in self.perf_tags)

    @property
    def regressions(self) -> list[Difference]:
        return [d for d in self.differences if "worse" in d.verdicts]

    def perf_tags_note(self) -> str | None:
        """What to say where the runs' perf tags differ; None where they match."""
        if self.perf_tags_match:
            return None
        shown = "; ".join(f"{letter(n)}: {', '.join(tags) or '-'}" for n, tags in enumerate(self.perf_tags))
        return f"perf tags differ ({shown}): these runs may not be meant to perform alike"

    def significant(self) -> str:
        """How many differences reach the threshold, and which."""
        flagged = [d.metric for d in self.differences if any(d.verdicts)]
        named = f": {', '.join(flagged)}" if flagged else ""
        return f"{len(flagged)} significant difference(s) at ±{100 * self.threshold:g}%{named}"

    def as_dict(self) -> dict[str, Any]:
        tags: dict[str, Any] = {"a": self.perf_tags[0], "b": self.perf_tags[1], "match": self.perf_tags_match}
        if len(self.perf_tags) > 2:
            tags["all"] = self.perf_tags
        return {
            "perf_tags": tags,
            "threshold": self.threshold,
            "differences": [d.as_dict() for d in self.differences],
            "regressions": [d.metric for d in self.regressions],
            "config_differences": self.config_differences,
            "endings": self.endings,
        }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def goodput_of(data: dict[str, Any]) -> float | None:
    """The report's goodput over all its sessions (productive over total time)."""
    sessions = data.get("goodput") or []
    total = sum(s.get("total_seconds", 0.0) for s in sessions)
    productive = sum(s.get("productive_seconds", 0.0) for s in sessions)
    return productive / total if total > 0 else None


def ending_of(data: dict[str, Any]) -> str | None:
    """How the run's last job ended: its status, with the run's first error where it did not
    complete; None where no job's end is known."""
    status = _last_job_status(data)
    if status is None or status == "completed":
        return status
    message = next((error.get("message") for error in data.get("errors") or []), None)
    return f"{status} ({message})" if message else status


def _last_job_status(data: dict[str, Any]) -> str | None:
    jobs = [job for session in data.get("goodput") or [] for job in session.get("jobs", [])]
    if not jobs:
        return None
    status = max(jobs, key=lambda job: job.get("start_unix_nano") or 0).get("status")
    return None if status is None else str(status)


def _difference(
    label: str, values: list[float | None], higher: bool | None, unit: str, threshold: float
) -> Difference:
    base = values[0]
    changes: list[float | None] = [None]
    verdicts = [""]
    for value in values[1:]:
        change = (value - base) / abs(base) if value is not None and base is not None and base != 0 else None
        changes.append(change)
        verdict = ""
        if change is not None and higher is not None and abs(change) >= threshold:
            verdict = "better" if (change > 0) == higher else "worse"
        verdicts.append(verdict)
    return Difference(label, values, changes, verdicts, unit)


def config_differences(reports: list[Report]) -> dict[str, list[Any]]:
    """The settings whose values are not the same in every run."""
    names = sorted({name for report in reports for name in report.config})
    values = {name: [report.config.get(name) for report in reports] for name in names}
    return {name: row for name, row in values.items() if any(v != row[0] for v in row)}


def compare_runs(reports: list[Report], threshold: float = 0.05) -> Comparison:
    """Differences of every run against the first; a relative change of at least ``threshold``
    is flagged."""
    if not threshold > 0:
        raise ValueError(f"compare threshold must be > 0, got {threshold!r}")
    if len(reports) < 2:
        raise ValueError(f"compare needs at least two runs, got {len(reports)}")
    data = [report.as_dict() for report in reports]
    differences = [
        _difference(label, [_number(d[section].get(key)) for d in data], higher, unit, threshold)
        for label, section, key, higher, unit in _METRICS
    ]
    differences.append(_difference("goodput", [goodput_of(d) for d in data], True, "%", threshold))
    tags = [d["identity"]["perf_tags"] for d in data]
    endings = [ending_of(d) for d in data]
    return Comparison(tags, differences, threshold, config_differences(reports), endings)


def render_comparison(comparison: Comparison, names: list[str]) -> list[Any]:
    """Rich renderables for the terminal: who A, B, ... are, then one row per metric."""
    from rich.text import Text

    # The runs above the table, not as its title: a title wraps to the table's width, which would
    # break a long path or run id at 80 columns.
    letters = [letter(i) for i in range(len(names))]
    return [
        Text("\n".join(f"{x} = {name}" for x, name in zip(letters, names, strict=True)), style="bold"),
        _table(comparison, letters),
        *_notes(comparison, letters),
    ]


def _table(comparison: Comparison, letters: list[str]) -> Any:
    """One row per metric: each run's value, the changes against A, and the verdicts. Of more
    than two runs each change stands in a row of its own under its run's value: a column per
    change cut the numbers to "4.0…" at 80 columns from four runs on."""
    from rich import box
    from rich.table import Table

    from traintel.analysis.report_text import fmt_unit

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("metric", justify="left", no_wrap=True)
    changes = ["change"] if len(letters) == 2 else []
    for column in [*letters, *changes]:
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("", justify="right")  # the verdicts, wrapped at "," where room is short
    for d in comparison.differences:
        values = [fmt_unit(v, d.unit) for v in d.values]
        cells = _change_cells(d, letters)
        if changes:
            table.add_row(d.metric, *values, *cells)
        else:
            table.add_row(d.metric, *values, cells[-1])
            if any(change is not None for change in d.changes):
                table.add_row("  vs A", "", *cells[:-1], "")
    return table


def _change_cells(d: Difference, letters: list[str]) -> list[Any]:
    """A metric's changes against A (coloured by verdict), then its verdicts in words."""
    from rich.text import Text

    cells: list[Any] = []
    for change, verdict in zip(d.changes[1:], d.verdicts[1:], strict=True):
        style = {"worse": "red", "better": "green"}.get(verdict, "")
        cells.append(Text("-" if change is None else f"{100 * change:+.1f}%", style=style))
    verdicts = [
        f"{x} {v}" if len(letters) > 2 else v for x, v in zip(letters[1:], d.verdicts[1:], strict=True) if v
    ]
    style = "red" if "worse" in d.verdicts else "green" if any(d.verdicts) else ""
    cells.append(Text(", ".join(verdicts), style=style))
    return cells


def _notes(comparison: Comparison, letters: list[str]) -> list[Any]:
    """What to know beside the table: perf tags and configurations that differ, and how many
    differences are significant."""
    from rich.text import Text

    note = comparison.perf_tags_note()
    out = [Text(note, style="yellow")] if note else []
    for name, values in comparison.config_differences.items():
        shown = ", ".join(f"{x} {'-' if v is None else v}" for x, v in zip(letters, values, strict=True))
        out.append(Text(f"config {name} differs: {shown}", style="yellow"))
    ended = comparison.not_completed()
    if ended:
        out.append(Text(ended, style="yellow"))
    return [*out, Text(comparison.significant())]
