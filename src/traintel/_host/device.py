"""Device-side hooks at phase boundaries: deferred CUDA-event timing and NVTX ranges; and the
per-window memory peaks of ``training_metrics_update``.

Why deferred: reading a CUDA event's time right after recording it needs a synchronisation,
which stalls the CPU until the GPU catches up and so serialises the very pipeline being
measured. Instead each forward / backward / optimizer range records a start and an end event on
the current stream, the pair waits in a bounded queue, and pairs whose end event has completed
(``event.query()``, non-blocking) are resolved at later phase ends and at each window close.
Their GPU time lands in the window that resolves them (at most a few steps late).

Cost when off: the engine's ``device`` hook is None and each phase boundary pays one ``is None``
test. The resolution logic takes any "event-like" objects, so it is tested on CPU; the CUDA and
NVTX calls themselves have not been run on a GPU.
"""

from __future__ import annotations

import logging
import resource
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from traintel import semconv
from traintel._host.flops import autocast_dtype
from traintel._host.gpu import initialised_cuda
from traintel._host.signal_raised import raised_by_signal_handler
from traintel.config import Settings

_logger = logging.getLogger(__name__)

#: The step phases timed on the device, by span name, and their short names in attributes.
TIMED_PHASES = {
    semconv.Phase.MODEL_FORWARD.value: "forward",
    semconv.Phase.MODEL_BACKWARD.value: "backward",
    semconv.Phase.OPTIMIZER_UPDATE.value: "optimizer",
}
#: Event pairs kept in flight at most (a GPU far behind the CPU is throttled by its launch
#: queue long before this); beyond it the oldest pair is dropped and counted.
MAX_PENDING = 1024


class EventLike(Protocol):
    """What is needed of ``torch.cuda.Event``."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...


class PendingTimings:
    """Event pairs waiting for the device; resolved in order, without ever waiting.

    Pairs are recorded on one stream, so they complete in order: resolution stops at the first
    pair whose end has not completed. Resolved events go back to ``release`` for reuse. A lock,
    because a window may close on another thread (the span processor's, for plain-OTel spans).
    """

    def __init__(
        self, capacity: int = MAX_PENDING, release: Callable[[EventLike], None] | None = None
    ) -> None:
        self.capacity = capacity
        self._pending: deque[tuple[str, EventLike, EventLike]] = deque()
        self._release = release
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.dropped = 0

    def add(self, phase: str, start: EventLike, end: EventLike) -> None:
        with self._lock:
            if len(self._pending) >= self.capacity:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append((phase, start, end))

    def poll(self) -> None:
        """Resolve every pair at the head of the queue whose end event has completed."""
        with self._lock:
            self._poll()

    def _poll(self) -> None:
        pending = self._pending
        while pending:
            phase, start, end = pending[0]
            if not end.query():
                return
            pending.popleft()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + start.elapsed_time(end) / 1000.0  # ms
            self.counts[phase] = self.counts.get(phase, 0) + 1
            if self._release is not None:
                self._release(start)
                self._release(end)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def window_attributes(self, out: dict[str, float | int | str]) -> None:
        """Poll, then move what was resolved since the last window into ``out``."""
        prefix = semconv.WINDOW_DEVICE_TIME_PREFIX
        with self._lock:
            self._poll()
            out[semconv.WINDOW_DEVICE_TIMING_MODE] = semconv.TIMING_MODE_CUDA_EVENT
            for phase, seconds in self.seconds.items():
                out[prefix + phase] = seconds
                out[prefix + phase + ".count"] = self.counts[phase]
            out[semconv.WINDOW_DEVICE_TIME_PENDING] = len(self._pending)
            out[semconv.WINDOW_DEVICE_TIME_DROPPED] = self.dropped
            self.seconds, self.counts, self.dropped = {}, {}, 0


class EventTimer:
    """Records an event pair around each timed step phase; events are pooled and reused."""

    def __init__(self, new_event: Callable[[], EventLike], capacity: int = MAX_PENDING) -> None:
        self._new_event = new_event
        self._pool: list[EventLike] = []
        self._open: dict[str, EventLike] = {}
        self.timings = PendingTimings(capacity, self._pool.append)

    def _event(self) -> EventLike:
        event = self._pool.pop() if self._pool else self._new_event()
        event.record()
        return event

    def started(self, phase: str) -> None:
        short = TIMED_PHASES.get(phase)
        if short is not None:
            self._open[short] = self._event()

    def ended(self, phase: str) -> None:
        short = TIMED_PHASES.get(phase)
        if short is None:
            return
        start = self._open.pop(short, None)
        if start is not None:
            self.timings.add(short, start, self._event())
        self.timings.poll()


class NvtxRanges:
    """One NVTX range per phase span, named ``<phase>`` or ``<phase> <iteration>``."""

    def __init__(self, push: Callable[[str], Any], pop: Callable[[], Any]) -> None:
        self._push = push
        self._pop = pop

    def started(self, phase: str, iteration: int | None) -> None:
        self._push(phase if iteration is None else f"{phase} {iteration}")

    def ended(self) -> None:
        self._pop()


class DeviceHooks:
    """What the phase API calls at each phase boundary when a device feature is on."""

    def __init__(self, timer: EventTimer | None, nvtx: NvtxRanges | None) -> None:
        self.timer = timer
        self.nvtx = nvtx

    def started(self, phase: str, iteration: int | None = None) -> None:
        try:
            if self.nvtx is not None:
                self.nvtx.started(phase, iteration)
            if self.timer is not None:
                self.timer.started(phase)
        except Exception as exc:  # never into training, but what a signal handler raised is the job's
            if raised_by_signal_handler(exc):
                raise
            _logger.debug("traintel: device hook failed at the start of %s: %s", phase, exc)

    def ended(self, phase: str) -> None:
        try:
            if self.timer is not None:
                self.timer.ended(phase)
            if self.nvtx is not None:
                self.nvtx.ended()
        except Exception as exc:
            if raised_by_signal_handler(exc):
                raise
            _logger.debug("traintel: device hook failed at the end of %s: %s", phase, exc)


class AutocastProbe(DeviceHooks):
    """The device hooks (if any) plus a look at autocast at every phase start, until the
    compute dtype is known; then the engine puts the plain hooks back.

    Why at phase starts: the dtype picks the peak FLOP/s column, and autocast is usually
    entered inside the iteration, around the forward pass, where nothing else of traintel
    runs. Riding on the device hooks costs nothing on the step once the dtype is known (or the
    first window closed without autocast: fp32)."""

    def __init__(self, hooks: DeviceHooks | None, found: Callable[[str], None]) -> None:
        super().__init__(hooks.timer if hooks else None, hooks.nvtx if hooks else None)
        self._found = found

    def started(self, phase: str, iteration: int | None = None) -> None:
        super().started(phase, iteration)
        dtype = autocast_dtype()
        if dtype is not None:
            self._found(dtype)


def device_hooks(settings: Settings, warn_once: Callable[..., Any]) -> DeviceHooks | None:
    """The hooks the configuration asks for and this machine supports, else None.

    Both features need CUDA: asked for without it they are refused with one warning (imports
    torch only when one of them is on)."""
    timing = settings.cuda_event_timing == "on"
    nvtx = settings.nvtx == "on"
    if not (timing or nvtx):
        return None
    cuda = _cuda()
    if cuda is None:
        asked = [name for name, on in (("TRAINTEL_CUDA_EVENT_TIMING", timing), ("TRAINTEL_NVTX", nvtx)) if on]
        warn_once("device_hooks", "%s ignored: no CUDA device", " and ".join(f"{name}=on" for name in asked))
        return None
    timer = EventTimer(lambda: cuda.Event(enable_timing=True)) if timing else None
    ranges = NvtxRanges(cuda.nvtx.range_push, cuda.nvtx.range_pop) if nvtx else None
    return DeviceHooks(timer, ranges)


def _cuda() -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch.cuda if torch.cuda.is_available() else None
    except Exception:
        return None


def peak_rss_bytes() -> int:
    """The process' peak resident set since it started (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


#: ``getrusage`` is a system call: about 1 µs on a quiet Linux host, but 45-540 µs measured
#: under load in a sandboxed kernel (gVisor), which at one call per window was most of the
#: per-iteration overhead. The high-water mark is read at most once per this interval.
PEAK_RSS_REFRESH_NS = 1_000_000_000
_peak_rss = [0, 0, 0]  # value (bytes), monotonic time of the read, reads so far


def recent_peak_rss_bytes(now_ns: int) -> int:
    """:func:`peak_rss_bytes` as of at most ``PEAK_RSS_REFRESH_NS`` before ``now_ns``
    (monotonic); a high-water mark, so a cached value is never above the true one."""
    value, read_ns, reads = _peak_rss
    if not reads or now_ns - read_ns >= PEAK_RSS_REFRESH_NS:
        value = peak_rss_bytes()
        _peak_rss[:] = [value, now_ns, reads + 1]
    return value


def annotate_window(
    out: dict[str, float | int | str], hooks: DeviceHooks | None, device: int | None = None
) -> None:
    """The device part of a closed window: memory peaks (the CUDA ones reset for the next
    window), the timing modes, and the device times resolved since the previous window.
    ``device``: the training thread's CUDA device (the current one is per thread)."""
    out[semconv.WINDOW_TIMING_MODE] = semconv.TIMING_MODE_WALL_CLOCK
    out[semconv.WINDOW_PROCESS_PEAK_RSS_SINCE_START] = recent_peak_rss_bytes(time.monotonic_ns())
    cuda = initialised_cuda()
    if cuda is not None:
        try:
            out[semconv.WINDOW_DEVICE_MEMORY_PEAK_ALLOCATED] = int(cuda.max_memory_allocated(device))
            out[semconv.WINDOW_DEVICE_MEMORY_PEAK_RESERVED] = int(cuda.max_memory_reserved(device))
            cuda.reset_peak_memory_stats(device)
        except Exception as exc:
            _logger.debug("traintel: no CUDA memory peaks: %s", exc)
    if hooks is not None and hooks.timer is not None:
        hooks.timer.timings.window_attributes(out)
