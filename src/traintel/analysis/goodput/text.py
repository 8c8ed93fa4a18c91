"""``traintel goodput`` for a person: the sessions' tables, and the times its options take."""

from __future__ import annotations

import math

from traintel.analysis.goodput.sessions import JobGoodput, SessionGoodput
from traintel.analysis.links import TraceLinks
from traintel.analysis.run_info import utc_text
from traintel.analysis.summary import fmt_seconds
from traintel.semconv import BADPUT_CATEGORIES


def _bar(share: float, width: int = 20) -> str:
    share = min(1.0, max(0.0, share))
    return "#" * round(share * width)


def render_goodput(results: list[SessionGoodput], links: TraceLinks | None = None) -> str:
    """The tables a person reads, in 80 columns; trace ids with their links where
    ``TRAINTEL_TRACE_URL`` sets them."""
    if not results:
        return "no training sessions found"
    lines: list[str] = []
    for r in results:
        tags = f" (perf_tag {', '.join(r.perf_tags)})" if r.perf_tags else ""
        lines.append(f"session {r.session}{tags}")
        lines.append(f"  {utc_text(r.start_ns)} -> {utc_text(r.end_ns)} UTC, {fmt_seconds(r.total_s)}")
        last = "no training iteration" if r.last_iteration is None else f"last iteration {r.last_iteration}"
        lines.append(f"  {len(r.jobs)} job(s), {r.disruptions} disruption(s), {last}")
        lines.extend(_rank_missing_lines(r.jobs))
        lines.append(f"  {'goodput':<32}{r.goodput:8.2%}{fmt_seconds(r.productive_s):>12}  {_bar(r.goodput)}")
        for category in BADPUT_CATEGORIES:
            share = r.badput(category)
            took = fmt_seconds(r.badput_s[category])
            lines.append(f"  {'badput ' + category:<32}{share:8.2%}{took:>12}  {_bar(share)}")
        layers = r.layers()
        lines.append(
            f"  layers: infrastructure {layers['infrastructure']['badput']:.2%} badput, "
            f"framework {layers['framework']['badput']:.2%} badput"
        )
        if r.model_flops_utilization is not None:
            lines.append(f"  model: MFU over productive time {r.model_flops_utilization:.2%}")
        if r.energy_j.get("total"):
            lines.append(_energy_line(r.energy_j))
        lines.extend(_step_time_lines(r, links))
        lines.append(
            f"  {'job (run id, restart)':<24}{'ranks':>6}{'start (UTC)':>21}{'time':>11}{'goodput':>9}"
        )
        for j in r.jobs:
            lines.extend(_job_lines(j))
        lines.append("")
    return "\n".join(lines).rstrip()


def _rank_missing_lines(jobs: list[JobGoodput]) -> list[str]:
    """``--rank N`` that names no rank of a job: said before the figures, which are then of
    another rank."""
    lines = []
    for j in jobs:
        asked = j.rank_missing
        if asked is not None:
            lines.append(f"  --rank {asked}: no rank {asked} in job {j.run_id}, {j.restart}")
            ranks = ranks_text(j.ranks)
            lines.append(f"    (its ranks: {ranks}); its rank {j.rank_used} is counted instead")
    return lines


def ranks_text(ranks: list[int]) -> str:
    """``0-63`` for a run of ranks, else ``0, 2, 5``."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def _energy_line(energy: dict[str, float]) -> str:
    total = energy["total"]
    parts = ", ".join(f"{k} {v / total:.1%}" for k, v in energy.items() if k != "total" and v)
    return f"  GPU energy {total / 1e3:,.1f} kJ (all ranks)" + (f": {parts}" if parts else "")


def _step_time_lines(r: SessionGoodput, links: TraceLinks | None) -> list[str]:
    if not r.ideal_step_time_s:
        return []
    lines = [f"  ideal step time {fmt_seconds(r.ideal_step_time_s)} (mean of steps <= median + 3 MAD)"]
    if r.recent_deviation:
        last = r.recent_deviation[-1]
        lines.append(
            f"  last window deviation: p50 {last['p50']:+.1%}  p90 {last['p90']:+.1%}  p99 {last['p99']:+.1%}"
        )
    for entry in r.most_deviating:
        ideal = entry["ideal_seconds"]
        own = f" over its loop's ideal {fmt_seconds(ideal)}" if ideal != r.ideal_step_time_s else ""
        deviation = f"{entry['deviation']:+.0%}{own}"
        job = f" in job {entry['run_id']}, {entry['restart']}" if len(r.jobs) > 1 else ""
        took = fmt_seconds(entry["seconds"])
        lines.append(f"    iteration {entry['iteration']}{job}: {took} ({deviation})")
        if "trace_id" in entry:
            lines.append(f"      trace {entry['trace_id']} span {entry['span_id']}")
            url = links.url(entry["trace_id"], entry["span_id"]) if links is not None else None
            if url:
                lines.append(f"      {url}")
    return lines


def _job_lines(j: JobGoodput) -> list[str]:
    """A job's row of the table (its run id cut to fit; whole in ``--json``), its iterations
    and status, and what of it was inferred."""
    iterations = f"{j.first_iteration}-{j.last_iteration}" if j.first_iteration is not None else "-"
    run_id = j.run_id if len(j.run_id) <= 18 else j.run_id[:17] + "…"
    name = f"{run_id}, {j.restart}"
    started, took = utc_text(j.start_ns), fmt_seconds(j.total_s)
    lines = [
        f"  {name:<24}{len(j.ranks):>6}{started:>21}{took:>11}{j.goodput:>9.2%}",
        f"    iterations {iterations}, {j.status}",
    ]
    if j.wall_clock_step_s:  # durations stay right; timestamps after the step are off by it
        lines.append(f"    the wall clock stepped by {j.wall_clock_step_s:+.1f} s during this job:")
        lines.append("    durations from the monotonic clock, later timestamps that far off")
    tail = j.inferred_tail
    if tail is not None:
        counted = [f"{tail.marked_iterations} in the progress mark"] if tail.marked_iterations else []
        if tail.exported_iterations:
            counted.append(f"{tail.exported_iterations} exported iteration spans")
        missing = f", {tail.missing_iterations} not exported (not counted)" if tail.missing_iterations else ""
        lines.append(f"    iterations {tail.first_iteration}-{tail.last_iteration} {tail.after}:")
        lines.append(f"    counted from {' and '.join(counted)}{missing}")
    if j.unaccounted_s > 0:
        after = f"iteration {j.unaccounted_after}" if j.unaccounted_after is not None else "the start"
        took = fmt_seconds(j.unaccounted_s)
        lines.append(f"    unaccounted: {took} after {after} (what ran then is unknown)")
    return lines


def parse_time(text: str) -> int:
    """Unix nanoseconds from ISO 8601 (UTC unless an offset is given) or Unix seconds."""
    import datetime

    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError(f"not a finite time: {text!r}")
        return round(seconds * 1e9)
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an ISO 8601 time or Unix seconds: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return round(moment.timestamp() * 1e9)
