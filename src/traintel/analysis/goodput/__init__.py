"""Goodput and badput across the jobs of a training session, from the embedded default's files.

Why files: a session spans restarts (a crash, a preemption, a requeue), and no live process
sees it whole. Every job's process wrote its spans; the ones that matter here are always
exported: the phase spans (init, checkpoints, evaluation, loops) and one ``training_window``
record per window of iterations (iteration spans themselves are tail-sampled).

The rules, applied to each job's reference rank (the lowest, unless asked):

* A job lasts from its first span's start to the end of its outermost span (``application``,
  else ``training_loop``); a job whose end was never exported (SIGKILL, node loss) ends at its
  last exported activity (span end, event or metric point). A job that overlaps the next one
  ends where the next begins.
* Inside a job every instant belongs to the innermost categorised phase covering it
  (``semconv.BADPUT_CATEGORY_OF_PHASE``; data loading inside an iteration excepted: it is the
  window's data-loading wait). Time inside a window not covered by a phase holds the window's
  productive time, data-loading wait and program startup; the rest of it (between iterations)
  and of the job is ``other``.
* Jobs are clipped where the next job of the session starts (a late exit flush can carry a
  later time); the session ends at the latest clipped end, so its total is the sum of its jobs
  and the gaps between them, and of its buckets.
* Between jobs: ``infrastructure_recovery`` after a job that did not end cleanly (error status,
  or no exported end), ``other`` (a scheduling gap) after one that did.
* A job's iterations after its last window record (the window open when it was killed) are
  counted from its exported iteration spans, as one inferred window: exact when every iteration
  was exported (plain-OpenTelemetry loops, "all" mode, or the first ones of a run), the exported
  ones only when they were sampled; the job's ``inferred_tail`` says which and how many.
* ``wasted_progress``: the productive time of a job's iterations that a later job of the
  session ran again (it resumed from an older checkpoint). Windows are the granularity: a window
  partly redone contributes its productive time in proportion to the iterations redone.
* An interval (``start``/``end``) clips phases exactly; a window cut by the interval
  contributes in proportion to its uncovered time inside the interval.

Every category is a share of the same total and the shares sum to 1 (``other`` is the rest).
"""

from traintel.analysis.goodput.reading import GoodputReader, load_jobs
from traintel.analysis.goodput.sessions import SessionGoodput, compute_goodput, session_goodput
from traintel.analysis.goodput.text import parse_time, render_goodput

__all__ = [
    "GoodputReader",
    "SessionGoodput",
    "compute_goodput",
    "load_jobs",
    "parse_time",
    "render_goodput",
    "session_goodput",
]
