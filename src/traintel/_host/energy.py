"""GPU energy per window, per job and per goodput category, from NVML's energy counter.

Why the counter and not power samples: ``nvmlDeviceGetTotalEnergyConsumption`` is the energy the
board drew since the driver loaded, in millijoules (Volta and later). Reading it at two moments
gives the energy between them exactly, whatever happened in between; integrating sampled power
misses every spike between samples. So there is no sampling: the counter is read at boundaries.

Definitions (the user guide repeats them):

* The counter is read when the job's telemetry starts (or at the first boundary where this
  process's GPU is known), at every window boundary (when the window's goodput record is
  released, off the step), and when the application ends. The energy of an interval is the
  difference of two reads, in whole millijoules; consecutive intervals share their boundary,
  so the windows' energies and the tail's add up to the job's exactly.
* The job's energy is the last read minus the first; per token (per sample) it is divided by
  the tokens (samples) this rank processed over the same reads.
* Energy by goodput category: within one interval, power is taken as constant, and the
  interval's energy is split in proportion to the seconds each category booked in it
  (productive time and data-loading wait when a window's record is released, a checkpoint or
  evaluation when it ends); the interval's seconds nobody booked are ``other``. A category
  booked late (a phase that began in an earlier interval) can make the booked seconds exceed
  the interval: the split is then over the booked seconds. The shares of an interval sum to
  1 and the category energies to the interval's energy: the last category takes the remainder.
* Cost = energy in kWh x ``TRAINTEL_ENERGY_PRICE_PER_KWH``.

Which GPU: the one this process trains on (``hw.id`` of the current CUDA device, or the one
``CUDA_VISIBLE_DEVICES`` pins to this local rank), else the only GPU visible. A process that sees
several GPUs and has not said which it uses gets no energy figures rather than the node's.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics as metrics_api
from opentelemetry.metrics import CallbackOptions, Observation

from traintel import semconv
from traintel._host.gpu import gpu_in_use, load_nvml, nvml_devices
from traintel.version import __version__

_logger = logging.getLogger(__name__)

_JOULES_PER_KWH = 3.6e6
#: The clock the reads are stamped with (the goodput ledger's: wall time in ns).
clock_ns: Callable[[], int] = time.time_ns
OTHER = "other"
PRODUCTIVE = "productive"


# --- the counter ------------------------------------------------------------------------------------
def open_counter(
    nvml: Any | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Callable[[], int] | None, bool]:
    """A read of NVML's total-energy counter of the GPU this process trains on (millijoules),
    and whether to ask again later when there is none: only while several GPUs are visible and
    the job has not yet shown which is its own (no NVML, no GPU, or a GPU without the counter:
    never)."""
    nvml = load_nvml() if nvml is None else nvml
    if nvml is None:
        return None, False
    environ = os.environ if environ is None else environ
    try:
        nvml.nvmlInit()
        devices = nvml_devices(nvml, environ)
        ours = gpu_in_use(environ, nvml)
        handles = [h for hw_id, h in devices if hw_id == ours] if ours else []
        if not handles and ours is None and len(devices) == 1:
            handles = [devices[0][1]]
        if not handles:
            return None, ours is None and len(devices) > 1
        return lambda: sum(int(nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in handles), False
    except Exception as exc:
        _logger.debug("traintel: no GPU energy counter: %s", exc)
        return None, False


# --- the arithmetic ---------------------------------------------------------------------------------
def split_energy(joules: float, interval_s: float, booked_s: Mapping[str, float]) -> dict[str, float]:
    """``joules`` spent over ``interval_s`` seconds, by category in proportion to the seconds
    each booked in it, the unbooked rest as ``other``; the parts sum to ``joules`` (the last
    part is the remainder)."""
    booked = {c: s for c, s in booked_s.items() if s > 0}
    total_booked = math.fsum(booked.values())
    span = max(interval_s, total_booked)
    if span <= 0:
        return {OTHER: joules} if joules else {}
    if interval_s > total_booked:
        booked[OTHER] = booked.get(OTHER, 0.0) + (interval_s - total_booked)
    parts = {c: joules * s / span for c, s in booked.items()}
    last = next(reversed(parts))
    parts[last] = joules - math.fsum(v for c, v in parts.items() if c != last)
    return parts


@dataclass
class EnergyInterval:
    """The energy between two reads and where it went."""

    start_ns: int
    end_ns: int
    millijoules: int
    by_category: dict[str, float]  # J
    tokens: float
    samples: float

    @property
    def joules(self) -> float:
        return self.millijoules / 1000.0


@dataclass
class EnergyLedger:
    """Reads at boundaries turned into intervals and job totals (pure arithmetic: the reads and
    the booked seconds are handed in)."""

    price_per_kwh: float | None = None
    first_ns: int | None = None
    last_ns: int = 0
    first_mj: int = 0
    last_mj: int = 0
    last_booked: dict[str, float] = field(default_factory=dict)
    last_tokens: float = 0.0
    last_samples: float = 0.0
    tokens: float = 0.0
    samples: float = 0.0
    by_category: dict[str, float] = field(default_factory=dict)  # J, since the first read
    intervals: int = 0
    last_window: EnergyInterval | None = None  # the last interval in which work was done

    def read(
        self, now_ns: int, counter_mj: int, booked_s: Mapping[str, float], tokens: float, samples: float
    ) -> EnergyInterval | None:
        """One boundary: the first starts the ledger, each later one closes an interval."""
        if self.first_ns is None:
            self.first_ns, self.first_mj = now_ns, counter_mj
            self._move(now_ns, counter_mj, booked_s, tokens, samples)
            return None
        millijoules = max(0, counter_mj - self.last_mj)  # a counter never goes back; a reset would
        booked = {c: max(0.0, s - self.last_booked.get(c, 0.0)) for c, s in booked_s.items()}
        interval = EnergyInterval(
            self.last_ns, now_ns, millijoules,
            split_energy(millijoules / 1000.0, max(0, now_ns - self.last_ns) / 1e9, booked),
            tokens - self.last_tokens, samples - self.last_samples,
        )  # fmt: skip
        for category, joules in interval.by_category.items():
            self.by_category[category] = self.by_category.get(category, 0.0) + joules
        self.tokens += interval.tokens
        self.samples += interval.samples
        self.intervals += 1
        if interval.tokens > 0 or interval.samples > 0:
            self.last_window = interval
        self._move(now_ns, self.last_mj + millijoules, booked_s, tokens, samples)
        return interval

    def _move(
        self, now_ns: int, counter_mj: int, booked_s: Mapping[str, float], tokens: float, samples: float
    ) -> None:
        self.last_ns, self.last_mj = now_ns, counter_mj
        self.last_booked = dict(booked_s)
        self.last_tokens, self.last_samples = tokens, samples

    @property
    def joules(self) -> float:
        return (self.last_mj - self.first_mj) / 1000.0

    def cost(self, joules: float) -> float | None:
        return joules / _JOULES_PER_KWH * self.price_per_kwh if self.price_per_kwh is not None else None

    def attributes(self, prefix: str) -> dict[str, float | int | str]:
        """The job's totals so far: ``<prefix>energy`` (J), its time, per token / sample, cost,
        and ``<prefix>energy.<category>`` (J)."""
        if self.first_ns is None or not self.intervals:
            return {}
        joules = self.joules
        out: dict[str, float | int | str] = {
            prefix + "energy": joules,
            prefix + "energy.time": (self.last_ns - self.first_ns) / 1e9,
        }
        if self.tokens > 0:
            out[prefix + "energy.per_token"] = joules / self.tokens
        if self.samples > 0:
            out[prefix + "energy.per_sample"] = joules / self.samples
        cost = self.cost(joules)
        if cost is not None:
            out[prefix + "energy.cost"] = cost
        for category, value in self.by_category.items():
            out[prefix + "energy." + category] = value
        return out


# --- the consumer -------------------------------------------------------------------------------------
class EnergyAccounting:
    """Reads the counter at the job's boundaries and puts the energy on the window records, the
    loop summary, the application span and the metrics. One narrow entry per boundary kind; all
    of it off the step (window boundaries and the job's start and end)."""

    def __init__(self, goodput: Any, totals: Any, price_per_kwh: float | None = None) -> None:
        self._goodput = goodput  # the goodput ledger (read, never written): the seconds booked
        self._totals = totals  # the engine (read, never written): the tokens and samples so far
        self._counter: Callable[[], int] | None = None
        self._look = True  # for the counter: until found, or known to be absent
        self._lock = threading.Lock()
        self.ledger = EnergyLedger(price_per_kwh)
        self._read()  # the job's first read, if this process's GPU is known already

    def _read(self) -> EnergyInterval | None:
        if self._counter is None:
            if not self._look:
                return None
            self._counter, self._look = open_counter()
            if self._counter is None:
                return None
        try:
            counter_mj = self._counter()
        except Exception as exc:  # a board without the counter (before Volta): never again
            _logger.debug("traintel: GPU energy counter unreadable: %s", exc)
            if self.ledger.first_ns is None:
                self._counter, self._look = None, False
            return None
        tokens, samples = self._totals.tokens_total, self._totals.samples_total
        with self._lock:
            return self.ledger.read(clock_ns(), counter_mj, self._booked_seconds(), tokens, samples)

    def _booked_seconds(self) -> dict[str, float]:
        goodput = self._goodput
        return {PRODUCTIVE: goodput.productive_s, **goodput.booked()}

    # --- the hooks: never raise into training ------------------------------------------------
    def released(self, records: list[Any], final_loop: Any | None = None) -> None:
        """Window records released: the interval up to now goes on them (shared in proportion
        to their time when several are released at once). At the loop's end (``final_loop``: its
        span, still open) the loop's summary gets the job's energy so far."""
        try:
            interval = self._read() if records else None
            if interval is not None:
                _annotate(records, interval)
            if final_loop is not None:
                with self._lock:
                    summary = self.ledger.attributes(semconv.SUMMARY_PREFIX)
                final_loop.set_attributes(summary)
        except Exception as exc:
            _logger.debug("traintel: energy not accounted: %s", exc)

    def application_ended(self, span: Any) -> None:
        """The application span, just before it ends: the job's energy, the tail after the last
        window included."""
        try:
            self._read()
            with self._lock:
                attributes = self.ledger.attributes("ml.training.")
            if attributes:
                span.set_attributes(attributes)
        except Exception as exc:
            _logger.debug("traintel: energy not accounted: %s", exc)


def _annotate(records: list[Any], interval: EnergyInterval) -> None:
    """Each record's share of the interval (by its time from the previous record's end; the
    last takes the remainder) and its categories; per token and per sample follow from the
    record's tokens and samples, so the record does not repeat them."""
    start = interval.start_ns
    span = max(1, interval.end_ns - start)
    remaining_j = interval.joules
    remaining = dict(interval.by_category)
    prefix = semconv.WINDOW_PREFIX
    for position, record in enumerate(records):
        last = position == len(records) - 1
        share = 1.0 if last else min(1.0, max(0, record.end_ns - start) / span)
        joules = remaining_j if last else interval.joules * share
        parts = remaining if last else {c: j * share for c, j in interval.by_category.items()}
        if not last:
            remaining_j -= joules
            remaining = {c: remaining[c] - parts[c] for c in remaining}
            start = max(start, record.end_ns)
        out: dict[str, float | int | str] = {prefix + "energy": joules}
        out.update((prefix + "energy." + c, j) for c, j in parts.items())
        record.annotations = {**(record.annotations or {}), **out}


# --- the metrics --------------------------------------------------------------------------------------
class EnergyInstruments:
    """``ml.training.energy`` (J, by ``ml.training.energy.category``), its cost, and the last
    interval's energy per token and per sample; callbacks on the metric reader's thread."""

    def __init__(
        self, meter_provider: metrics_api.MeterProvider, source: Callable[[], EnergyAccounting | None]
    ) -> None:
        meter = meter_provider.get_meter(semconv.INSTRUMENTATION_SCOPE, __version__)
        self._source = source
        counter, gauge = meter.create_observable_counter, meter.create_observable_gauge
        for create, name, callback, unit, description in (
            (counter, semconv.METRIC_ENERGY, self._energy, "J",
             "GPU energy this job drew (NVML counter), by goodput category."),
            (counter, semconv.METRIC_ENERGY_COST, self._cost, "1",
             "Cost of the GPU energy, in the currency of TRAINTEL_ENERGY_PRICE_PER_KWH."),
            (gauge, semconv.METRIC_ENERGY_PER_TOKEN, self._per("tokens"), "J/{token}",
             "GPU energy per token over the last window."),
            (gauge, semconv.METRIC_ENERGY_PER_SAMPLE, self._per("samples"), "J/{sample}",
             "GPU energy per sample over the last window."),
        ):  # fmt: skip
            create(name, [callback], unit=unit, description=description)

    def _ledger(self) -> EnergyLedger | None:
        accounting = self._source()
        return accounting.ledger if accounting is not None else None

    def _energy(self, options: CallbackOptions) -> Iterable[Observation]:
        ledger = self._ledger()
        if ledger is None or not ledger.intervals:
            return []
        return [
            Observation(joules, {semconv.ENERGY_CATEGORY: category})
            for category, joules in list(ledger.by_category.items())
        ]

    def _cost(self, options: CallbackOptions) -> Iterable[Observation]:
        ledger = self._ledger()
        cost = ledger.cost(ledger.joules) if ledger is not None and ledger.intervals else None
        return [] if cost is None else [Observation(cost)]

    def _per(self, unit: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            ledger = self._ledger()
            interval = ledger.last_window if ledger is not None else None
            count = getattr(interval, unit) if interval is not None else 0
            return [Observation(interval.joules / count)] if interval is not None and count > 0 else []

        return observe
