-- traintel's goodput, stragglers and checkpoint cost as ClickHouse views over the tables the
-- OpenTelemetry Collector's `clickhouse` exporter writes (its default schema: otel_traces, and
-- otel_metrics_gauge / _sum / _histogram for the activity of a job killed before its spans left).
-- Run the statements in order (clickhouse-client --multiquery < traintel_views.sql) in the
-- database the exporter writes to. Each view is the same definition as `traintel goodput --json`
-- (docs: "Goodput and stragglers in your backend"); tests/test_clickhouse_views.py holds every
-- bucket equal to the CLI's on the sessions the test suite builds.
--
-- What the views read: every attribute is a string in the exporter's maps (numbers as Go writes
-- them), so values are parsed with toInt64OrNull / toFloat64OrZero. Whole sessions only: the
-- CLI's --start/--end interval has no equivalent here.
--
-- No metrics exported to ClickHouse? Replace the first view with an empty one:
--   CREATE OR REPLACE VIEW traintel_metric_activity AS
--   SELECT '' AS instance, toInt64(0) AS last_ns WHERE 0;

-- The latest metric point of each process (a job killed before its spans were exported still
-- shows how long it lived).
CREATE OR REPLACE VIEW traintel_metric_activity AS
SELECT
    coalesce(nullIf(ResourceAttributes['service.instance.id'], ''),
             nullIf(ResourceAttributes['ml.training.run_id'], ''), 'unknown') AS instance,
    max(toUnixTimestamp64Nano(TimeUnix)) AS last_ns
FROM (
    SELECT ResourceAttributes, TimeUnix FROM otel_metrics_gauge
    UNION ALL SELECT ResourceAttributes, TimeUnix FROM otel_metrics_sum
    UNION ALL SELECT ResourceAttributes, TimeUnix FROM otel_metrics_histogram
)
GROUP BY instance;

-- Every span with the identity of the process (one rank of one job) that exported it.
CREATE OR REPLACE VIEW traintel_spans AS
SELECT
    coalesce(nullIf(ResourceAttributes['service.instance.id'], ''),
             nullIf(ResourceAttributes['ml.training.run_id'], ''), 'unknown') AS instance,
    coalesce(nullIf(ResourceAttributes['ml.training.session_tag'], ''),
             nullIf(ResourceAttributes['ml.training.run_id'], ''), instance) AS session,
    coalesce(nullIf(ResourceAttributes['ml.training.run_id'], ''), instance) AS run_id,
    ifNull(toInt64OrNull(ResourceAttributes['ml.training.restart_count']), 0) AS restart,
    ifNull(toInt64OrNull(ResourceAttributes['ml.training.rank']), 0) AS rank,
    ResourceAttributes['ml.training.perf_tag'] AS perf_tag,
    TraceId,
    SpanId,
    ParentSpanId,
    SpanName,
    SpanAttributes['ml.training.phase'] AS phase,
    toUnixTimestamp64Nano(Timestamp) AS start_ns,
    start_ns + toInt64(Duration) AS end_ns,
    StatusCode,
    SpanAttributes,
    Links.TraceId AS link_trace_ids,
    Links.SpanId AS link_span_ids,
    Events.Name AS event_names,
    arrayMap(t -> toUnixTimestamp64Nano(t), Events.Timestamp) AS event_ns
FROM otel_traces;

-- One row per window record (every rank), the derived numbers restored: productive time is the
-- iterations' time less data-loading wait, nested badput and program startup.
CREATE OR REPLACE VIEW traintel_windows AS
SELECT
    session, run_id, restart, rank, instance, perf_tag,
    ifNull(toInt64OrNull(SpanAttributes['ml.training.window.index']), -1) AS window_index,
    start_ns,
    end_ns,
    ifNull(toInt64OrNull(SpanAttributes['ml.training.window.first_iteration']), 0) AS first_iteration,
    ifNull(toInt64OrNull(SpanAttributes['ml.training.window.last_iteration']), 0) AS last_iteration,
    ifNull(toInt64OrNull(SpanAttributes['ml.training.window.iterations']), 0) AS iterations,
    toFloat64OrZero(SpanAttributes['ml.training.window.iteration_time.total']) AS iteration_seconds,
    toFloat64OrZero(SpanAttributes['ml.training.window.data_loading_time']) AS data_loading_seconds,
    toFloat64OrZero(SpanAttributes['ml.training.window.program_startup_time']) AS program_startup_seconds,
    if(mapContains(SpanAttributes, 'ml.training.window.iteration_time.min')
           AND mapContains(SpanAttributes, 'ml.training.window.iteration_time.total'),
       greatest(0., iteration_seconds - data_loading_seconds
                    - toFloat64OrZero(SpanAttributes['ml.training.window.nested_badput_time'])
                    - program_startup_seconds),
       toFloat64OrZero(SpanAttributes['ml.training.window.productive_time'])) AS productive_seconds,
    if(iterations > 0, iteration_seconds / iterations, NULL) AS mean_iteration_seconds,
    -- mean compute time before the synchronisation point (watch_ddp / mark_sync_point), if marked
    toFloat64OrNull(SpanAttributes['ml.training.window.compute_time']) AS mean_compute_seconds
FROM traintel_spans
WHERE SpanName = 'training_window';

-- One row per process: its timeline and what goodput needs from it, as arrays (phases with their
-- badput category, data-loading waits inside iterations, window records, exported iterations).
CREATE OR REPLACE VIEW traintel_processes AS
WITH
    categorised AS (
        SELECT instance, start_ns, end_ns,
               multiIf(phase IN ('dist_init', 'data_loader_init', 'model_init', 'optimizer_init'), 'initialization',
                       phase = 'checkpoint_load', 'checkpoint_load',
                       phase IN ('checkpoint_save_sync', 'checkpoint_save_async'), 'checkpoint_save',
                       phase IN ('validation_loop', 'testing_loop'), 'evaluation',
                       phase = 'data_loading', 'data_loading', '') AS category
        FROM traintel_spans
        -- (a phase run beside training, off the training thread, held nothing up)
        WHERE SpanName != 'training_window' AND category != '' AND SpanAttributes['thread.name'] = ''
    ),
    -- Data loading inside an exported iteration of the same trace is the window's wait, not a
    -- phase of its own (an iteration's subtree is exported whole or not at all).
    iterations AS (
        SELECT instance, TraceId, start_ns, end_ns,
               toInt64OrNull(SpanAttributes['ml.training.iteration']) AS number, StatusCode = 'Error' AS failed
        FROM traintel_spans
        WHERE phase = 'training_iteration' AND SpanName != 'training_window'
    ),
    loading AS (
        SELECT d.instance AS instance, d.start_ns AS start_ns, d.end_ns AS end_ns,
               countIf(i.start_ns <= d.start_ns AND d.end_ns <= i.end_ns AND i.instance != '') > 0 AS inner_wait
        FROM (SELECT instance, TraceId, start_ns, end_ns FROM traintel_spans
              WHERE phase = 'data_loading' AND SpanName != 'training_window') AS d
        LEFT JOIN iterations AS i ON d.instance = i.instance AND d.TraceId = i.TraceId
        GROUP BY d.instance, d.TraceId, d.start_ns, d.end_ns
    ),
    phase_arrays AS (
        SELECT instance, groupArray((start_ns, end_ns, category)) AS phases
        FROM (SELECT instance, start_ns, end_ns, category FROM categorised WHERE category != 'data_loading'
              UNION ALL
              SELECT instance, start_ns, end_ns, 'data_loading' FROM loading WHERE NOT inner_wait)
        GROUP BY instance
    ),
    inner_arrays AS (
        SELECT instance, groupArray((start_ns, end_ns)) AS inner_data FROM loading WHERE inner_wait GROUP BY instance
    ),
    window_arrays AS (
        SELECT instance,
               groupArray((start_ns, end_ns, first_iteration, last_iteration, productive_seconds,
                           data_loading_seconds, program_startup_seconds)) AS records
        FROM (SELECT DISTINCT instance, start_ns, end_ns, first_iteration, last_iteration, productive_seconds,
                     data_loading_seconds, program_startup_seconds FROM traintel_windows)
        GROUP BY instance
    ),
    iteration_arrays AS (
        SELECT instance, groupArray((number, last_start, last_end)) AS exported
        FROM (SELECT instance, assumeNotNull(number) AS number, max(i.start_ns) AS last_start, argMax(i.end_ns, i.start_ns) AS last_end
              FROM iterations AS i WHERE number IS NOT NULL AND NOT failed GROUP BY instance, number)
        GROUP BY instance
    ),
    outer_spans AS (
        -- the outermost span's final end: the latest application's, else the latest training loop's
        SELECT instance,
               argMax((end_ns, StatusCode = 'Error', phase = 'application'), (phase = 'application', end_ns))
                   AS final_end
        FROM traintel_spans
        WHERE phase IN ('application', 'training_loop')
          AND SpanAttributes['ml.training.segment.continues'] != 'true'
        GROUP BY instance
    ),
    timelines AS (
        SELECT instance,
               any(session) AS session, any(run_id) AS run_id, any(restart) AS restart, any(rank) AS rank,
               any(perf_tag) AS perf_tag,
               minIf(s.start_ns, s.start_ns > 0) AS first_ns,
               max(greatest(s.end_ns, arrayMax(arrayPushBack(s.event_ns, toInt64(0))))) AS span_last_ns,
               countIf(has(event_names, 'preemption')) > 0 AS preempted,
               minIf(toInt64OrNull(SpanAttributes['ml.training.train_iterations_start']),
                     phase = 'training_loop'
                     AND ifNull(toInt64OrNull(SpanAttributes['ml.training.segment.index']), 0) = 0) AS resume
        FROM traintel_spans AS s
        GROUP BY instance
    )
SELECT
    t.instance AS instance, t.session AS session, t.run_id AS run_id, t.restart AS restart, t.rank AS rank,
    t.perf_tag AS perf_tag, t.first_ns AS start_ns,
    greatest(t.span_last_ns, ifNull(m.last_ns, 0)) AS last_ns,
    -- a job of loops without an application that trained past its latest loop's end (a second
    -- stage killed mid-way) has no end
    o.instance != '' AND (o.final_end.3 OR greatest(arrayMax(arrayPushBack(arrayMap(r -> r.2, w.records), 0)),
                                                     arrayMax(arrayPushBack(arrayMap(i -> i.3, e.exported), 0)))
                                            <= o.final_end.1) AS has_end,
    if(has_end, o.final_end.1, NULL) AS end_ns,
    has_end AND NOT o.final_end.2 AS ended_cleanly,
    -- an application's end; without one, the process's last record (evaluation after the loop)
    if(o.instance != '' AND o.final_end.3, o.final_end.1, greatest(last_ns, t.first_ns, ifNull(end_ns, 0)))
        AS stop_ns,
    t.preempted AS preempted,
    t.resume AS resume,
    p.phases AS phases,
    n.inner_data AS inner_data,
    w.records AS records,
    e.exported AS exported
FROM timelines AS t
LEFT JOIN traintel_metric_activity AS m ON m.instance = t.instance
LEFT JOIN outer_spans AS o ON o.instance = t.instance
LEFT JOIN phase_arrays AS p ON p.instance = t.instance
LEFT JOIN inner_arrays AS n ON n.instance = t.instance
LEFT JOIN window_arrays AS w ON w.instance = t.instance
LEFT JOIN iteration_arrays AS e ON e.instance = t.instance
SETTINGS join_use_nulls = 0;

-- Each process's windows: its records, then one inferred window per exported iteration after
-- the last record (a job killed mid-window), accounted as the live recorder would: productive
-- but for its data-loading wait and the categorised phases inside it; the first one's excess
-- over the median of the others is program startup when the job has no record at all.
CREATE OR REPLACE VIEW traintel_process_windows AS
WITH
    if(empty(records), -1, arrayMax(arrayMap(r -> r.4, records))) AS covered,
    arraySort(i -> i.1, arrayFilter(i -> i.1 > covered, exported)) AS tail,
    if(empty(tail), 0, tail[1].2) AS begin_ns,
    arraySort(arrayMap(d -> (d.1, d.2), arrayFilter(d -> d.2 > begin_ns, inner_data))) AS tail_waits,
    arraySort(arrayMap(q -> (q.1, q.2), arrayFilter(q -> q.2 > begin_ns, phases))) AS tail_phases,
    arrayMap(i -> (i.3 - i.2) / 1e9, tail) AS durations,
    if(length(tail) >= 2 AND empty(records),
       arrayReduce('quantileExactInclusive(0.5)', arraySlice(durations, 2)), NULL) AS typical,
    arrayMap((i, position) -> (
        i,
        durations[position],
        arrayFold((acc, x) -> (acc.1 + greatest(0, least(x.2, i.3) - greatest(x.1, acc.2)),
                               greatest(acc.2, least(x.2, i.3))),
                  tail_waits, (toInt64(0), i.2)).1 / 1e9,
        arrayFold((acc, x) -> (acc.1 + greatest(0, least(x.2, i.3) - greatest(x.1, acc.2)),
                               greatest(acc.2, least(x.2, i.3))),
                  tail_phases, (toInt64(0), i.2)).1 / 1e9,
        position), tail, arrayEnumerate(tail)) AS measured,
    arrayMap(m -> (m.1, m.3, m.2 - m.3 - m.4,
                   if(typical IS NOT NULL AND m.5 = 1, greatest(0., least(m.2 - ifNull(typical, 0.), m.2 - m.3 - m.4)), 0.)),
             measured) AS rooms
SELECT
    instance, session, run_id, restart, rank, perf_tag, start_ns, last_ns, end_ns, ended_cleanly, stop_ns,
    preempted, resume, phases,
    arrayConcat(
        arrayMap(r -> (r.1, r.2, r.3, r.4, r.5, r.6, r.7, false), records),
        arrayMap(x -> (x.1.2, x.1.3, x.1.1, x.1.1, greatest(0., x.3 - x.4), x.2, x.4, true), rooms)
    ) AS windows,
    length(tail) AS tail_exported,
    if(empty(tail), 0, tail[-1].1 - tail[1].1 + 1 - length(tail)) AS tail_missing,
    least(arrayMin(arrayMap(w -> w.3, windows)), ifNull(resume, arrayMin(arrayMap(w -> w.3, windows)))) AS ran_first,
    arrayMax(arrayMap(w -> w.4, windows)) AS ran_last
FROM traintel_processes;

-- One row per job (a launch: its ranks share run id and restart count), accounted on its
-- reference rank (the lowest) over its own time, ending where the next job of the session
-- starts if it overlaps it. Every instant belongs to the innermost categorised phase covering
-- it; a window with uncovered time inside the job gives its productive time (less the share of
-- its iterations a later job ran again: wasted progress), data-loading wait and startup; the
-- rest is `other`.
CREATE OR REPLACE VIEW traintel_job_goodput AS
WITH
    -- A launch started again under the same run id and restart count is a job of its own: in
    -- start order a process is its rank's n-th, and its launch the largest n of any rank so far.
    occurrences AS (
        SELECT instance, session, run_id, restart, rank, start_ns,
               row_number() OVER (PARTITION BY session, run_id, restart, rank ORDER BY start_ns, instance) AS occurrence
        FROM traintel_process_windows
    ),
    launches AS (
        SELECT *, max(occurrence) OVER (PARTITION BY session, run_id, restart ORDER BY start_ns, instance
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS launch
        FROM occurrences
    ),
    jobs AS (
        SELECT session, run_id, restart, launch,
               groupArray(rank) AS ranks,
               argMin(instance, rank) AS reference
        FROM launches
        GROUP BY session, run_id, restart, launch
    ),
    ordered AS (
        SELECT j.session AS session, j.run_id AS run_id, j.restart AS restart, j.ranks AS ranks,
               p.rank AS rank_used, p.perf_tag AS perf_tag, p.start_ns AS start_ns, p.stop_ns AS stop_ns,
               p.end_ns AS exported_end_ns, p.ended_cleanly AS ended_cleanly, p.preempted AS preempted,
               p.resume AS resume, p.phases AS phases, p.windows AS windows,
               p.tail_exported AS tail_exported, p.tail_missing AS tail_missing,
               (notEmpty(p.windows), p.ran_first, p.ran_last) AS ran,
               leadInFrame(p.start_ns, 1, toInt64(-1)) OVER whole AS next_start,
               row_number() OVER whole AS position,
               count() OVER whole AS session_jobs,
               groupArray(ran) OVER later AS later_ranges
        FROM jobs AS j
        INNER JOIN traintel_process_windows AS p ON p.instance = j.reference
        WINDOW whole AS (PARTITION BY session ORDER BY start_ns, run_id, restart
                         ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING),
               later AS (PARTITION BY session ORDER BY start_ns, run_id, restart
                         ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING)
    ),
    timed AS (
        SELECT *,
               if(next_start >= 0, least(stop_ns, next_start), stop_ns) AS clipped_ns,
               greatest(clipped_ns, start_ns) AS job_end_ns,
               arraySort(p -> (p.1, p.2, p.3),
                         arrayFilter(p -> p.2 > start_ns AND p.1 < job_end_ns, phases)) AS job_phases,
               arraySort(arrayMap(p -> (p.1, p.2), job_phases)) AS by_start,
               arraySort(arrayDistinct(arrayConcat(
                   [start_ns, job_end_ns],
                   arrayMap(p -> greatest(start_ns, least(job_end_ns, p.1)), job_phases),
                   arrayMap(p -> greatest(start_ns, least(job_end_ns, p.2)), job_phases)))) AS edges,
               -- each elementary interval and the category of the innermost phase covering it
               arrayMap(k -> (edges[k + 1] - edges[k],
                              ifNull(arraySort(p -> (-p.1, p.2, p.3),
                                               arrayFilter(p -> p.1 <= edges[k] AND p.2 > edges[k], job_phases))[1].3,
                                     '')),
                        range(1, toUInt64(length(edges)))) AS pieces,
               -- the windows with time inside the job that no phase covers
               arrayFilter(w -> greatest(w.1, start_ns) < least(w.2, job_end_ns)
                                AND least(w.2, job_end_ns) - greatest(w.1, start_ns)
                                    > arrayFold((acc, x) -> (acc.1 + greatest(0, least(x.2, least(w.2, job_end_ns))
                                                                              - greatest(x.1, acc.2)),
                                                             greatest(acc.2, least(x.2, least(w.2, job_end_ns)))),
                                                by_start, (toInt64(0), greatest(w.1, start_ns))).1,
                           windows) AS counted,
               -- a checkpoint load after which the next window went back to iterations run before
               -- it (an in-process restart, a rollback): the progress past that point is discarded
               -- (that window's start, its first iteration)
               arraySort(w -> w.1, windows) AS by_time,
               arrayMap(r -> (by_time[r.1].1, by_time[r.1].3),
                        arrayFilter(r -> r.1 > 1 AND by_time[r.1 - 1].2 <= r.2
                                         AND by_time[r.1].3 <= arrayMax(arrayMap(w -> w.4, arraySlice(by_time, 1, r.1 - 1))),
                                    arrayMap(p -> (arrayFirstIndex(w -> w.1 >= p.2, by_time), p.2),
                                             arrayFilter(p -> p.3 = 'checkpoint_load', phases)))) AS rewinds,
               -- the share of each counted window's iterations that a later job ran again, or that
               -- a later window of its own went back to
               arrayMap(w -> if(w.4 - w.3 + 1 > 0,
                                arrayFold((acc, r) -> (acc.1 + if(least(r.2, w.4) >= greatest(r.1, w.3, acc.2 + 1),
                                                                  least(r.2, w.4) - greatest(r.1, w.3, acc.2 + 1) + 1, 0),
                                                       greatest(acc.2, least(r.2, w.4))),
                                          arraySort(arrayConcat(
                                              arrayMap(r -> (r.2, r.3), arrayFilter(r -> r.1, later_ranges)),
                                              arrayMap(r -> (r.2, w.4), arrayFilter(r -> r.1 > w.1, rewinds)))),
                                          (toInt64(0), w.3 - 1)).1 / (w.4 - w.3 + 1),
                                0.),
                        counted) AS wasted_fractions
        FROM ordered
    )
SELECT
    session, perf_tag, run_id, restart, ranks, rank_used, position, session_jobs,
    start_ns AS start_unix_nano, job_end_ns AS end_unix_nano,
    multiIf(preempted, 'preempted', exported_end_ns IS NULL, 'no end exported',
            NOT ended_cleanly, 'failed', 'completed') AS status,
    ended_cleanly, next_start, clipped_ns,
    (job_end_ns - start_ns) / 1e9 AS total_seconds,
    arraySum(arrayMap((w, f) -> w.5 * (1 - f), counted, wasted_fractions)) AS productive_seconds,
    arraySum(arrayMap(x -> if(x.2 = 'initialization', x.1, 0), pieces)) / 1e9 AS initialization_seconds,
    arraySum(arrayMap(x -> if(x.2 = 'checkpoint_load', x.1, 0), pieces)) / 1e9 AS checkpoint_load_seconds,
    arraySum(arrayMap(x -> if(x.2 = 'checkpoint_save', x.1, 0), pieces)) / 1e9 AS checkpoint_save_seconds,
    arraySum(arrayMap(x -> if(x.2 = 'data_loading', x.1, 0), pieces)) / 1e9
        + arraySum(arrayMap(w -> w.6, counted)) AS data_loading_seconds,
    arraySum(arrayMap(x -> if(x.2 = 'evaluation', x.1, 0), pieces)) / 1e9 AS evaluation_seconds,
    arraySum(arrayMap(w -> w.7, counted)) AS program_startup_seconds,
    arraySum(arrayMap((w, f) -> w.5 * f, counted, wasted_fractions)) AS wasted_progress_seconds,
    0. AS infrastructure_recovery_seconds,
    total_seconds - productive_seconds - initialization_seconds - checkpoint_load_seconds
        - checkpoint_save_seconds - data_loading_seconds - evaluation_seconds - program_startup_seconds
        - wasted_progress_seconds AS other_seconds,
    if(total_seconds > 0, productive_seconds / total_seconds, 0.) AS goodput,
    if(ran.1, ran.2, NULL) AS first_iteration,
    if(ran.1, ran.3, NULL) AS last_iteration,
    resume AS resumed_from,
    tail_exported AS inferred_tail_exported_iterations,
    tail_missing AS inferred_tail_missing_iterations
FROM timed;

-- One row per session (all jobs with the same session tag): its jobs' buckets, and between jobs
-- infrastructure recovery after a job that did not end cleanly (error status, or no exported end)
-- or `other` (a scheduling gap) after one that did. `other` is the residual, so the buckets sum
-- to the total.
CREATE OR REPLACE VIEW traintel_session_goodput AS
SELECT
    session,
    arraySort(groupUniqArrayIf(j.perf_tag, j.perf_tag != '')) AS perf_tags,
    count() AS jobs,
    min(j.start_unix_nano) AS start_unix_nano,
    max(j.end_unix_nano) AS end_unix_nano,
    (end_unix_nano - start_unix_nano) / 1e9 AS total_seconds,
    sum(j.productive_seconds) AS productive_seconds,
    sum(j.initialization_seconds) AS initialization_seconds,
    sum(j.checkpoint_load_seconds) AS checkpoint_load_seconds,
    sum(j.checkpoint_save_seconds) AS checkpoint_save_seconds,
    sum(j.data_loading_seconds) AS data_loading_seconds,
    sum(j.evaluation_seconds) AS evaluation_seconds,
    sum(j.program_startup_seconds) AS program_startup_seconds,
    sum(j.wasted_progress_seconds) AS wasted_progress_seconds,
    sumIf(greatest(j.next_start - j.clipped_ns, 0), j.next_start >= 0 AND NOT j.ended_cleanly) / 1e9
        AS infrastructure_recovery_seconds,
    sumIf(greatest(j.next_start - j.clipped_ns, 0), j.next_start >= 0 AND j.ended_cleanly) / 1e9 AS scheduling_gap_seconds,
    total_seconds - productive_seconds - initialization_seconds - checkpoint_load_seconds
        - checkpoint_save_seconds - data_loading_seconds - evaluation_seconds - program_startup_seconds
        - wasted_progress_seconds - infrastructure_recovery_seconds AS other_seconds,
    if(total_seconds > 0, productive_seconds / total_seconds, 0.) AS goodput,
    countIf(j.next_start >= 0 AND NOT j.ended_cleanly) AS disruptions,
    max(j.last_iteration) AS last_iteration
FROM traintel_job_goodput AS j
GROUP BY session;

-- Per window of a job seen on two or more ranks: every rank's mean compute time before the
-- synchronisation point (measure 'compute': DDP's all-reduce makes every rank's iteration time
-- the same, and the rank that arrives last is the straggler), or its mean iteration time where
-- not every rank marked that point (measure 'iteration'); the slowest rank and how far it lags
-- the median rank (lag ratio = slowest / median).
CREATE OR REPLACE VIEW traintel_stragglers AS
WITH
    -- a launch started again under the same run id and restart count is a job of its own, as in
    -- traintel_job_goodput: in start order a process is its rank's n-th, its launch the largest n
    -- of any rank so far
    launches AS (
        SELECT instance, max(occurrence) OVER (PARTITION BY session, run_id, restart ORDER BY start_ns, instance
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS launch
        FROM (
            SELECT instance, session, run_id, restart, start_ns,
                   row_number() OVER (PARTITION BY session, run_id, restart, rank ORDER BY start_ns, instance) AS occurrence
            FROM (SELECT instance, any(session) AS session, any(run_id) AS run_id, any(restart) AS restart,
                         any(rank) AS rank, min(start_ns) AS start_ns
                  FROM traintel_windows GROUP BY instance)
        )
    )
SELECT
    session, run_id, restart, launch, window_index,
    min(first_iteration) AS first_iteration,
    max(last_iteration) AS last_iteration,
    count() AS ranks,
    if(min(by_compute), 'compute', 'iteration') AS measure,
    argMax(rank, (seconds, -rank)) AS slowest_rank,
    max(seconds) AS slowest_seconds,
    quantileExactInclusive(0.5)(seconds) AS median_seconds,
    min(seconds) AS fastest_seconds,
    slowest_seconds / median_seconds AS lag_ratio
FROM (
    SELECT *, if(by_compute, assumeNotNull(mean_compute_seconds), mean_iteration_seconds) AS seconds
    FROM (
        SELECT *, min(mean_compute_seconds IS NOT NULL)
                      OVER (PARTITION BY session, run_id, restart, launch, window_index) AS by_compute
        FROM traintel_windows AS w
        INNER JOIN launches AS l ON l.instance = w.instance
        WHERE mean_iteration_seconds IS NOT NULL
    )
)
GROUP BY session, run_id, restart, launch, window_index
HAVING ranks >= 2;

-- Per checkpoint save or load: how long it blocked, its size, its stages (its child spans
-- staging / write / upload / finalize / barrier) with their seconds, and whether it failed. An
-- async save's finalize is parented on the training loop and linked to its save: a stage is
-- the save's by its parent or by a link. A save failed if its span or its finalize (the
-- background write) ended in error.
CREATE OR REPLACE VIEW traintel_checkpoints AS
SELECT
    c.session AS session, c.run_id AS run_id, c.restart AS restart, c.rank AS rank,
    if(c.phase = 'checkpoint_load', 'load', 'save') AS operation,
    c.phase AS phase,
    toInt64OrNull(c.SpanAttributes['ml.training.checkpoint.iteration']) AS iteration,
    c.SpanAttributes['ml.training.checkpoint.strategy'] AS strategy,
    c.start_ns AS start_unix_nano,
    (c.end_ns - c.start_ns) / 1e9 AS seconds,
    toFloat64OrNull(c.SpanAttributes['ml.training.checkpoint.size']) AS bytes,
    max(c.StatusCode = 'Error' OR (s.phase = 'checkpoint_finalize' AND s.StatusCode = 'Error')) AS failed,
    arraySort(groupArrayIf((substring(s.phase, 12), (s.end_ns - s.start_ns) / 1e9), s.SpanId != '')) AS stages,
    c.TraceId AS trace_id,
    c.SpanId AS span_id
FROM (SELECT * FROM traintel_spans
      WHERE phase IN ('checkpoint_save_sync', 'checkpoint_save_async', 'checkpoint_load')) AS c
LEFT JOIN (SELECT owner.1 AS owner_trace, owner.2 AS owner_span, SpanId, phase, start_ns, end_ns, StatusCode
           FROM traintel_spans
           ARRAY JOIN arrayDistinct(arrayZip(arrayConcat([TraceId], link_trace_ids),
                                             arrayConcat([ParentSpanId], link_span_ids))) AS owner
           WHERE phase IN ('checkpoint_staging', 'checkpoint_write', 'checkpoint_upload',
                           'checkpoint_finalize', 'checkpoint_barrier')) AS s
    ON s.owner_trace = c.TraceId AND s.owner_span = c.SpanId
GROUP BY session, run_id, restart, rank, operation, phase, iteration, strategy, start_unix_nano, seconds,
         bytes, trace_id, span_id
SETTINGS join_use_nulls = 0;
