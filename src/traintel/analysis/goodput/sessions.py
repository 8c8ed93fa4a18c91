"""Sessions from jobs: each job clipped where the next starts, the gaps between them, the
timeline of each job's reference rank, wasted progress, model goodput and step-time deviation.
"""

from __future__ import annotations

import bisect
import heapq
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from traintel.analysis.goodput.process import (
    InferredTail,
    Job,
    Process,
    Window,
    ran,
    reference,
    span_hex,
    trace_hex,
)
from traintel.analysis.goodput.reading import load_jobs
from traintel.analysis.goodput.timeline import job_timeline
from traintel.semconv import BADPUT_CATEGORIES

_FRAMEWORK = ("initialization", "checkpoint_load", "checkpoint_save", "data_loading", "evaluation",
              "program_startup")  # fmt: skip


class _Share:
    """Goodput over ``[start_ns, end_ns]`` from productive seconds (jobs and sessions)."""

    start_ns: int
    end_ns: int
    productive_s: float

    @property
    def total_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def goodput(self) -> float:
        return self.productive_s / self.total_s if self.total_s > 0 else 0.0


@dataclass
class JobGoodput(_Share):
    run_id: str
    restart: int
    ranks: list[int]
    rank_used: int
    start_ns: int
    end_ns: int
    status: str  # "completed", "failed", "preempted", or "no end exported" (killed, or still running)
    productive_s: float
    badput_s: dict[str, float]
    first_iteration: int | None
    last_iteration: int | None
    resumed_from: int | None
    goodput_by_rank: dict[int, float]
    #: The reference rank's iterations after its last window record (progress mark, spans).
    inferred_tail: InferredTail | None = None
    #: A job with no end exported: its seconds after the last moment its records and progress
    #: mark account for (what ran then is unknown), and the last iteration accounted before them.
    unaccounted_s: float = 0.0
    unaccounted_after: int | None = None
    #: How far the wall clock stepped during the job (its durations stay right: see the text).
    wall_clock_step_s: float = 0.0
    #: The rank asked for (``--rank``) where the job has none of that number: its lowest rank
    #: counted instead, which the output must say (else it reads as the rank asked for).
    rank_missing: int | None = None


@dataclass
class SessionGoodput(_Share):
    """A session's goodput over ``[start_ns, end_ns]``: seconds by category, and the detail."""

    session: str
    perf_tags: list[str]
    start_ns: int
    end_ns: int
    productive_s: float
    badput_s: dict[str, float]
    disruptions: int
    last_iteration: int | None
    jobs: list[JobGoodput]
    scheduling_gap_s: float = 0.0
    model_flops_utilization: float | None = None
    ideal_step_time_s: float | None = None
    recent_deviation: list[dict[str, float]] = field(default_factory=list)
    most_deviating: list[dict[str, Any]] = field(default_factory=list)
    #: GPU energy of the session's jobs, every rank, whole jobs (J: "total" and by category).
    energy_j: dict[str, float] = field(default_factory=dict)

    def badput(self, category: str) -> float:
        return self.badput_s.get(category, 0.0) / self.total_s if self.total_s > 0 else 0.0

    def layers(self) -> dict[str, dict[str, float]]:
        """Infrastructure (between jobs), framework (inside jobs) and model (MFU) views."""
        total = self.total_s or 1.0
        infrastructure = self.badput_s["infrastructure_recovery"] + self.scheduling_gap_s
        framework = sum(self.badput_s[c] for c in _FRAMEWORK)
        out: dict[str, dict[str, float]] = {
            "infrastructure": {
                "badput": infrastructure / total,
                "infrastructure_recovery": self.badput("infrastructure_recovery"),
                "scheduling_gap": self.scheduling_gap_s / total,
            },
            "framework": {"badput": framework / total, **{c: self.badput(c) for c in _FRAMEWORK}},
        }
        if self.model_flops_utilization is not None:
            out["model"] = {"mfu_over_productive_time": self.model_flops_utilization}
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "perf_tags": self.perf_tags,
            "start_unix_nano": self.start_ns,
            "end_unix_nano": self.end_ns,
            "total_seconds": self.total_s,
            "goodput": self.goodput,
            "productive_seconds": self.productive_s,
            "badput": {c: self.badput(c) for c in BADPUT_CATEGORIES},
            "badput_seconds": dict(self.badput_s),
            "scheduling_gap_seconds": self.scheduling_gap_s,
            "disruptions": self.disruptions,
            "last_iteration": self.last_iteration,
            "layers": self.layers(),
            "energy_joules": self.energy_j or None,
            "step_time": {
                "ideal_seconds": self.ideal_step_time_s,
                "recent_windows": self.recent_deviation,
                "most_deviating": self.most_deviating,
            },
            "jobs": [
                {
                    "run_id": j.run_id,
                    "restart": j.restart,
                    "ranks": j.ranks,
                    "rank_used": j.rank_used,
                    "rank_missing": j.rank_missing,
                    "start_unix_nano": j.start_ns,
                    "end_unix_nano": j.end_ns,
                    "status": j.status,
                    "total_seconds": j.total_s,
                    "goodput": j.goodput,
                    "productive_seconds": j.productive_s,
                    "badput_seconds": j.badput_s,
                    "first_iteration": j.first_iteration,
                    "last_iteration": j.last_iteration,
                    "resumed_from": j.resumed_from,
                    "goodput_by_rank": {str(k): v for k, v in j.goodput_by_rank.items()},
                    "inferred_tail": j.inferred_tail.as_dict() if j.inferred_tail is not None else None,
                    "unaccounted_seconds": j.unaccounted_s,
                    "unaccounted_after_iteration": j.unaccounted_after,
                    "wall_clock_step_s": j.wall_clock_step_s,
                }
                for j in self.jobs
            ],
        }


def compute_goodput(
    jobs: list[Job],
    start_ns: int | None = None,
    end_ns: int | None = None,
    rank: int | None = None,
    by_perf_tag: bool = False,
) -> list[SessionGoodput]:
    """Goodput of each session (``session_tag``; with ``by_perf_tag`` also split by perf tag)."""
    sessions: dict[tuple[str, str | None], list[Job]] = defaultdict(list)
    for job in jobs:
        sessions[(job.session, job.perf_tag if by_perf_tag else None)].append(job)
    results = []
    for (session, _), members in sorted(sessions.items(), key=lambda kv: kv[0][0]):
        result = _session(session, members, start_ns, end_ns, rank)
        if result is not None:
            results.append(result)
    return results


def session_goodput(
    paths: Iterable[str | os.PathLike[str]],
    start_ns: int | None = None,
    end_ns: int | None = None,
    rank: int | None = None,
    by_perf_tag: bool = False,
) -> list[SessionGoodput]:
    """Goodput of every session in the files or directories (the embedded default's output of
    one or more jobs and ranks), optionally over ``[start_ns, end_ns]`` (Unix nanoseconds)."""
    if start_ns is not None and end_ns is not None and end_ns <= start_ns:
        raise ValueError(f"end_ns={end_ns} must be after start_ns={start_ns}")
    return compute_goodput(load_jobs(paths), start_ns, end_ns, rank, by_perf_tag)


def _session(
    session: str, jobs: list[Job], start: int | None, end: int | None, rank: int | None
) -> SessionGoodput | None:
    jobs = sorted(jobs, key=lambda j: reference(j, rank).start_ns)
    refs = [reference(j, rank) for j in jobs]
    bounds = _bounds(refs, start, end)
    if bounds is None:
        return None
    a, b = bounds
    # wasted progress: the share of each window that a later job ran again
    # (each rank's windows are read back from their rows when its job is computed)
    later_of = _later_ranges(refs)
    ref_windows = [p.windows(later) for p, later in zip(refs, later_of, strict=True)]
    next_starts: list[int | None] = [p.start_ns for p in refs[1:]]
    next_starts.append(None)
    totals_ns: dict[str, int] = {}
    seconds: dict[str, float] = dict.fromkeys(BADPUT_CATEGORIES, 0.0)
    productive = 0.0
    scheduling_gap_ns = 0
    disruptions = 0
    job_results = []
    for job, process, windows, later, next_start in zip(
        jobs, refs, ref_windows, later_of, next_starts, strict=True
    ):
        job_end = process.stop_ns
        if next_start is not None:
            job_end = min(job_end, next_start)
            disruptions += not process.ended_cleanly
            scheduling_gap_ns += _gap(process, job_end, next_start, (a, b), totals_ns)
        job_end = max(job_end, process.start_ns)
        job_productive, prorated = job_timeline(process, windows, process.start_ns, job_end, a, b, totals_ns)
        productive += job_productive
        for category, value in prorated.items():
            seconds[category] += value
        job_results.append(_job_result(job, process, windows, later, next_start))
        if rank is not None and rank not in job.ranks:
            job_results[-1].rank_missing = rank
    for category, value in totals_ns.items():
        seconds[category] += value / 1e9
    total_s = (b - a) / 1e9
    named = sum(v for k, v in seconds.items() if k != "other")
    seconds["other"] = total_s - productive - named  # the residual, so the shares sum to 1
    # The step-time view holds a killed job's tail too; model statistics come from the records.
    windows = sorted((w for ws in ref_windows for w in ws), key=lambda w: w.end_ns)
    last_iteration = max((w.last for ws in ref_windows for w in ws), default=None)
    result = SessionGoodput(
        session=session,
        perf_tags=sorted({j.perf_tag for j in jobs if j.perf_tag}),
        start_ns=a,
        end_ns=b,
        productive_s=productive,
        badput_s=seconds,
        disruptions=disruptions,
        last_iteration=last_iteration,
        jobs=job_results,
        scheduling_gap_s=scheduling_gap_ns / 1e9,
    )
    _model_goodput(result, windows)
    _step_time(result, ref_windows, refs)
    result.energy_j = _session_energy(jobs)
    return result


def _later_ranges(refs: list[Process]) -> list[list[tuple[int, int]]]:
    """For each job, the iteration ranges the jobs after it ran (what it did that they redid
    is its wasted progress)."""
    ranges = [ran(p) for p in refs]
    return [[r for r in ranges[i + 1 :] if r is not None] for i in range(len(refs))]


def _bounds(refs: list[Process], start: int | None, end: int | None) -> tuple[int, int] | None:
    """The session's time, clipped to ``[start, end]`` where given: from its first job's start to
    the latest end of its jobs, each clipped where the next starts; None when nothing is left."""
    clipped = [
        min(p.stop_ns, refs[i + 1].start_ns) if i + 1 < len(refs) else p.stop_ns for i, p in enumerate(refs)
    ]
    session_start = refs[0].start_ns
    session_end = max(max(end, p.start_ns) for end, p in zip(clipped, refs, strict=True))
    a = session_start if start is None else max(start, session_start)
    b = session_end if end is None else min(end, session_end)
    return (a, b) if b > a else None


def _gap(
    process: Process, job_end: int, next_start: int, bounds: tuple[int, int], totals_ns: dict[str, int]
) -> int:
    """The time between a job's end and the next job's start, inside ``bounds``, into
    ``totals_ns``: infrastructure recovery after a failed job, ``other`` after a clean end (then
    also returned: the scheduling gap)."""
    gap = min(next_start, bounds[1]) - max(job_end, bounds[0])
    if gap <= 0:
        return 0
    key = "other" if process.ended_cleanly else "infrastructure_recovery"
    totals_ns[key] = totals_ns.get(key, 0) + gap
    return gap if process.ended_cleanly else 0


def _session_energy(jobs: list[Job]) -> dict[str, float]:
    """The GPU energy of every rank of the session's jobs (J, "total" and by category)."""
    out: dict[str, float] = {}
    for job in jobs:
        for member in job.ranks.values():
            for key, joules in member.energy.items():
                out[key] = out.get(key, 0.0) + joules
    return out


def _job_result(
    job: Job,
    process: Process,
    windows: list[Window],
    later: list[tuple[int, int]],
    limit: int | None,
) -> JobGoodput:
    """A job on its own, over its own time (ending where the next job starts, if it overlaps
    it): the reference rank's breakdown (``windows``: its windows) and each rank's goodput
    (``later``: the ranges of the later jobs, which decide its wasted progress)."""
    by_rank: dict[int, float] = {}
    productive, badput = 0.0, {}
    job_end = process.start_ns
    for number, member in sorted(job.ranks.items()):
        end = member.stop_ns if limit is None else min(member.stop_ns, limit)
        end = max(end, member.start_ns)
        counted: dict[str, int] = {}
        member_windows = windows if member is process else member.windows(later)
        kept, prorated = job_timeline(
            member, member_windows, member.start_ns, end, member.start_ns, end, counted
        )
        total = (end - member.start_ns) / 1e9
        by_rank[number] = kept / total if total > 0 else 0.0
        if member is process:
            productive, job_end = kept, end
            badput = {k: v / 1e9 for k, v in counted.items()}
            for k, v in prorated.items():
                badput[k] = badput.get(k, 0.0) + v
    if process.preempted:  # told to stop (SIGTERM/SIGINT), not a failure of the job
        status = "preempted"
    elif process.end_ns is None:
        status = "no end exported"
    else:
        status = "failed" if process.end_error else "completed"
    ranged = ran(process)
    unaccounted_s, after = _unaccounted(process, windows, job_end)
    return JobGoodput(
        run_id=job.run_id,
        restart=job.restart,
        ranks=sorted(job.ranks),
        rank_used=process.rank,
        start_ns=process.start_ns,
        end_ns=job_end,
        status=status,
        productive_s=productive,
        badput_s=badput,
        first_iteration=ranged[0] if ranged else None,
        last_iteration=ranged[1] if ranged else None,
        resumed_from=process.resume,
        goodput_by_rank=by_rank,
        inferred_tail=process.tail,
        unaccounted_s=unaccounted_s,
        unaccounted_after=after,
        wall_clock_step_s=process.wall_clock_step_s,
    )


def _unaccounted(process: Process, windows: list[Window], job_end: int) -> tuple[float, int | None]:
    """A job with no end exported: its seconds after the last moment its window records,
    progress mark and exported iterations account for, up to its last sign of life (clipped at
    ``job_end``); and the last iteration accounted. Nothing for a job that ended, or that never
    reached an iteration."""
    if process.end_ns is not None or not windows:
        return 0.0, None
    last = max(windows, key=lambda w: w.end_ns)
    accounted = max(last.end_ns, process.mark_ns)
    return max(0, job_end - accounted) / 1e9, max(w.last for w in windows)


def _model_goodput(result: SessionGoodput, windows: list[Window]) -> None:
    flops = useful = 0.0
    for w in windows:
        kept = w.productive_s * (1 - w.wasted_fraction)
        if w.flops and w.peak and w.productive_s > 0:
            flops += w.flops * (1 - w.wasted_fraction)
            useful += kept * w.peak
    if useful > 0:
        result.model_flops_utilization = flops / useful


def _step_time(
    result: SessionGoodput, ref_windows: list[list[Window]], refs: list[Process], recent: int = 10
) -> None:
    """Each loop's windows against its own ideal step time (its last window's): a resumed job
    on another node or config, or a later stage of one job (fine-tuning after pre-training),
    steps at its own pace, and one ideal would make every other iteration look slow or fast.
    The session shows the latest loop's ideal."""
    own = [(job, w, ideal) for job, ws in enumerate(ref_windows) for w, ideal in _loop_ideals(ws, refs[job])]
    own.sort(key=lambda item: item[1].end_ns)
    result.ideal_step_time_s = own[-1][2] if own else None
    if not own:
        return
    result.recent_deviation = [
        {
            "first_iteration": w.first,
            "last_iteration": w.last,
            "p50": w.p50 / ideal - 1,
            "p90": w.p90 / ideal - 1,
            "p99": w.p99 / ideal - 1,
        }
        for _job, w, ideal in [item for item in own if item[1].quantiles][-recent:]
    ]
    result.most_deviating = _most_deviating(result, own, refs)


def _loop_ideals(windows: list[Window], process: Process) -> list[tuple[Window, float]]:
    """Each window with an ideal, and its loop's (the last one of the windows that ended with
    or before the loop's end)."""
    ends = sorted(process.loop_ends)
    loops: dict[int, list[Window]] = {}
    for w in windows:
        loops.setdefault(bisect.bisect_left(ends, w.end_ns), []).append(w)
    out = []
    for members in loops.values():
        ideal = next((w.ideal for w in reversed(members) if w.ideal), None)
        out += [(w, ideal) for w in members] if ideal else []
    return out


def _most_deviating(
    result: SessionGoodput, own: list[tuple[int, Window, float]], refs: list[Process]
) -> list[dict[str, Any]]:
    """The five iterations the windows name that deviate most from their job's ideal step, with
    their job and, where exported, their trace and span ids: the job's own (iteration numbers
    repeat across the jobs of a resumed session)."""
    named = (item for item in own if item[1].slowest is not None)
    worst = heapq.nlargest(5, named, key=lambda item: item[1].max_s / item[2])
    wanted = {(job, w.slowest) for job, w, _ideal in worst}
    exported: dict[tuple[int, int], tuple[str, str]] = {}  # exported twice: the later one, as read
    for job, process in enumerate(refs):
        for number, _start, _end, high, low, span_id in process.iterations:
            if (job, number) in wanted:
                exported[(job, number)] = (trace_hex(high, low), span_hex(span_id))
    out = []
    for job, w, ideal in worst:
        entry: dict[str, Any] = {
            "iteration": w.slowest,
            "seconds": w.max_s,
            "deviation": w.max_s / ideal - 1,
            "ideal_seconds": ideal,
            "run_id": result.jobs[job].run_id,
            "restart": result.jobs[job].restart,
        }
        ids = exported.get((job, w.slowest)) if w.slowest is not None else None
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        out.append(entry)
    return out
