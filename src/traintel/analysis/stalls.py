"""The stalls of a job, from its ranks' hang records: who waited, in which collective, for whom.

Each rank writes one ``ml.training.hang_suspect`` record per stall and one
``ml.training.hang_recovered`` when it moves again (``traintel._host.stall``). Read together:

- a rank's stall runs from its suspect record's time less the seconds it had stalled, to its
  recovered record (or the end of the files);
- the ranks' stalls that overlap in time are one stall of the job;
- the wavefront is the highest collective count among them: the ranks that wait in a collective
  wait in that one, and a rank whose count is behind it never joined it: the culprit. When no
  rank waits in a collective, every stalled rank is its own culprit. Ranks of the job (its world
  size) with no record at all are named too: a rank that died, or whose records never left.
- ranks at the wavefront that wait in different collectives called them out of order; a rank
  with collectives in flight from two threads says which (two threads calling collectives on
  one process group interleave differently on each rank).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from traintel import semconv
from traintel.analysis.run_info import utc_text
from traintel.analysis.summary import fmt_seconds
from traintel.exporters.reader import LogEntry

#: What a stall's JSON says of each rank.
_SHOWN = (
    semconv.PHASE, semconv.ITERATION, semconv.HANG_PYTHON, semconv.HANG_STALLED_SECONDS,
    semconv.COLLECTIVES_ENTERED, semconv.COLLECTIVES_COMPLETED, semconv.HANG_WAITING_IN,
    semconv.HANG_TOP_FRAME, semconv.CODE_STACKTRACE, semconv.HANG_COLLECTIVE_THREADS,
)  # fmt: skip
#: What ``ml.training.hang.python`` says, in words.
PYTHON_STATES = {
    semconv.PYTHON_BLOCKED: "blocked in a call that released the GIL",
    semconv.PYTHON_RUNNING: "running Python",
    semconv.PYTHON_HOLDING_GIL: "C code holding the GIL",
}
#: Ranks named in a list before the rest are counted; stack lines shown of a culprit.
NAMED_RANKS = 8
STACK_LINES = 12
#: Stalls kept by a report (the first ones: a job that hangs again and again says so early).
MAX_STALLS = 50


@dataclass
class Stall:
    """One stall of the job: every rank's suspect record, by rank."""

    start_ns: int
    end_ns: int | None  # the last rank's recovery; None: some rank never recovered in the files
    records: dict[int, LogEntry] = field(default_factory=dict)
    world_size: int | None = None
    #: The job's last sign of life in the files (a span's end, a mark, a record): how long a
    #: stall never recovered lasted at least (None: unknown).
    last_seen_ns: int | None = None

    def _counts(self, key: str) -> dict[int, int]:
        return {rank: int(record.attributes.get(key, 0)) for rank, record in self.records.items()}

    @property
    def waiting(self) -> list[int]:
        """Ranks that wait in a collective."""
        return sorted(r for r, e in self.records.items() if e.attributes.get(semconv.HANG_WAITING_IN))

    @property
    def wavefront(self) -> int | None:
        """The collective the waiting ranks wait in (its sequence number), None if none waits."""
        entered = self._counts(semconv.COLLECTIVES_ENTERED)
        return max((entered[rank] for rank in self.waiting), default=None)

    @property
    def collective(self) -> str | None:
        """The name of the collective waited in, as the waiting ranks entered it."""
        names = {self.records[r].attributes.get(semconv.HANG_WAITING_IN) for r in self.waiting}
        return ", ".join(sorted(str(n) for n in names)) if names else None

    @property
    def out_of_order(self) -> dict[str, list[int]]:
        """The collectives the ranks at the wavefront wait in, by name, when they differ."""
        entered, wavefront = self._counts(semconv.COLLECTIVES_ENTERED), self.wavefront
        by_name: dict[str, list[int]] = {}
        for rank in self.waiting:
            if entered[rank] == wavefront:
                by_name.setdefault(str(self.records[rank].attributes[semconv.HANG_WAITING_IN]), []).append(
                    rank
                )
        return by_name if len(by_name) > 1 else {}

    @property
    def threaded(self) -> dict[tuple[str, ...], list[int]]:
        """Ranks with collectives in flight from more than one thread, by those threads."""
        found: dict[tuple[str, ...], list[int]] = {}
        for rank, record in sorted(self.records.items()):
            threads = tuple(str(t) for t in record.attributes.get(semconv.HANG_COLLECTIVE_THREADS) or ())
            if len(threads) > 1:
                found.setdefault(threads, []).append(rank)
        return found

    @property
    def culprits(self) -> list[int]:
        """Ranks behind the wavefront (never joined the collective the others wait in); every
        stalled rank when none waits."""
        wavefront = self.wavefront
        if wavefront is None:
            return sorted(self.records)
        entered = self._counts(semconv.COLLECTIVES_ENTERED)
        return sorted(rank for rank, count in entered.items() if count < wavefront)

    @property
    def silent(self) -> list[int]:
        """Ranks of the job without a record of this stall."""
        if self.world_size is None:
            return []
        return [rank for rank in range(self.world_size) if rank not in self.records]

    def rows(self) -> list[tuple[str, str]]:
        """(label, text) lines for a person: when, how long, who waits in what, the culprits."""
        rows = [("started", utc_text(self.start_ns) + " UTC"), ("lasted", self._lasted())]
        if self.waiting:
            rows.append(
                (
                    "waiting",
                    f"{_ranks(self.waiting)} {'wait' if len(self.waiting) > 1 else 'waits'} in collective "
                    f"#{self.wavefront} ({self.collective})",
                )
            )
        out_of_order = self.out_of_order
        if out_of_order:
            waits = "; ".join(f"{_ranks(ranks)} in {name}" for name, ranks in sorted(out_of_order.items()))
            rows.append(
                ("out of order", f"{waits}: the ranks called different collectives at #{self.wavefront}")
            )
        rows += [
            ("threads", f"{_ranks(ranks)}: collectives in flight from threads {', '.join(threads)}; two "
             "threads calling collectives on one process group can interleave differently on each rank "
             "and deadlock (give one its own group: torch.distributed.new_group)")
            for threads, ranks in self.threaded.items()
        ]  # fmt: skip
        rows += [("culprit", self._culprit(rank)) for rank in self.culprits[:NAMED_RANKS]]
        if len(self.culprits) > NAMED_RANKS:
            rows.append(("", f"and {len(self.culprits) - NAMED_RANKS} more"))
        if self.silent:
            rows.append(("no record", _ranks(self.silent)))
        return rows

    def _lasted(self) -> str:
        """How long: to the last rank's recovery; else at least to the job's last sign of life."""
        if self.end_ns is not None:
            return fmt_seconds((self.end_ns - self.start_ns) / 1e9)
        seen = self.last_seen_ns
        if seen is None or seen <= self.start_ns:
            return "not recovered"
        return (
            f"not recovered, at least {fmt_seconds((seen - self.start_ns) / 1e9)} (to the job's last sign "
            f"of life, {utc_text(seen)} UTC)"
        )

    def _culprit(self, rank: int) -> str:
        attributes = self.records[rank].attributes
        where = str(attributes.get(semconv.PHASE, "?"))
        if semconv.ITERATION in attributes:
            where += f" after iteration {attributes[semconv.ITERATION]}"
        state = str(attributes.get(semconv.HANG_PYTHON))
        at = f", at {attributes[semconv.HANG_TOP_FRAME]}" if semconv.HANG_TOP_FRAME in attributes else ""
        entered = attributes.get(semconv.COLLECTIVES_ENTERED, 0)
        return f"rank {rank} (entered #{entered}): {where}, {PYTHON_STATES.get(state, state)}{at}"

    def culprit_stack(self) -> tuple[int | None, str]:
        """The first culprit and the innermost lines of its stack ("" without one)."""
        if not self.culprits:
            return None, ""
        stack = str(self.records[self.culprits[0]].attributes.get(semconv.CODE_STACKTRACE, ""))
        return self.culprits[0], "\n".join(stack.rstrip().splitlines()[-STACK_LINES:])

    def as_dict(self) -> dict[str, Any]:
        return {
            "start_unix_nano": self.start_ns,
            "end_unix_nano": self.end_ns,
            "last_seen_unix_nano": self.last_seen_ns,
            "wavefront": self.wavefront,
            "collective": self.collective,
            "waiting": self.waiting,
            "culprits": self.culprits,
            "out_of_order": self.out_of_order,
            "silent": self.silent,
            "ranks": {
                str(rank): {key: record.attributes[key] for key in _SHOWN if key in record.attributes}
                for rank, record in sorted(self.records.items())
            },
        }


def _ranks(ranks: list[int]) -> str:
    named = ", ".join(str(r) for r in ranks[:NAMED_RANKS])
    more = len(ranks) - NAMED_RANKS
    return ("rank " if len(ranks) == 1 else "ranks ") + named + (f" and {more} more" if more > 0 else "")


@dataclass
class _RankStall:
    rank: int
    suspect: LogEntry
    start_ns: int
    end_ns: int | None


def _rank_of(entry: LogEntry) -> int:
    value = entry.attributes.get(semconv.RANK, entry.resource.get(semconv.RANK, 0))
    return int(value) if isinstance(value, int | float | str) and str(value).lstrip("-").isdigit() else 0


def _rank_stalls(entries: Iterable[LogEntry]) -> list[_RankStall]:
    """Each suspect record with its rank's next recovered record."""
    by_process: dict[tuple[str, int], list[LogEntry]] = {}
    for entry in entries:
        if entry.event_name in (semconv.EVENT_HANG_SUSPECT, semconv.EVENT_HANG_RECOVERED):
            process = str(entry.resource.get(semconv.SERVICE_INSTANCE_ID, "")), _rank_of(entry)
            by_process.setdefault(process, []).append(entry)
    found = []
    for (_instance, rank), records in by_process.items():
        open_stall: _RankStall | None = None
        for entry in sorted(records, key=lambda e: e.time_ns):
            if entry.event_name == semconv.EVENT_HANG_SUSPECT:
                stalled = float(entry.attributes.get(semconv.HANG_STALLED_SECONDS, 0.0))
                open_stall = _RankStall(rank, entry, entry.time_ns - int(stalled * 1e9), None)
                found.append(open_stall)
            elif open_stall is not None:
                open_stall.end_ns, open_stall = entry.time_ns, None
    return found


def find_stalls(entries: Iterable[LogEntry]) -> list[Stall]:
    """The job's stalls, earliest first (see the module docstring)."""
    stalls: list[Stall] = []
    for rank_stall in sorted(_rank_stalls(entries), key=lambda s: s.start_ns):
        current = stalls[-1] if stalls else None
        if current is None or (current.end_ns is not None and rank_stall.start_ns > current.end_ns):
            world = rank_stall.suspect.resource.get(semconv.WORLD_SIZE)
            current = Stall(
                rank_stall.start_ns, rank_stall.end_ns, world_size=world if isinstance(world, int) else None
            )
            stalls.append(current)
        elif current.end_ns is not None:
            current.end_ns = None if rank_stall.end_ns is None else max(current.end_ns, rank_stall.end_ns)
        current.records.setdefault(rank_stall.rank, rank_stall.suspect)
    return stalls
