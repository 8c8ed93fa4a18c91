"""One job on a counter clock, shared by the volume test and ``benchmarks/bench_export_volume.py``:
each runs it in a fresh interpreter, prefixed with ``RATE = ...`` and ``MINUTES = ...``."""

#: ``RATE`` steps/s for ``MINUTES`` on a counter clock (``time.time_ns`` advanced by the loop
#: itself): every step exactly 1/RATE s (5 % of it waiting for data), one in 200 five times
#: longer, a loss and a learning rate recorded; a metric collection every simulated interval of
#: the periodic reader the job got (read from it, not assumed), from a thread of its own.
VOLUME_JOB = """
import random, threading, time
S = 10**9
NOW = [1_700_000_000 * S]
time.time_ns = lambda: NOW[0]
time.monotonic_ns = time.time_ns  # traintel times with both: one simulated timeline
def tick(seconds):
    NOW[0] += round(seconds * S)
import traintel
from traintel._sdk import otel_private
step, n = 1 / RATE, int(60 * MINUTES * RATE)
jitter = random.Random(7)
telemetry = traintel.configure(warmup_iterations=0)
meters = telemetry.pipeline.meter_provider
(reader,) = otel_private.periodic_readers(meters)
interval = round(reader._export_interval_millis * 10**6)
next_collect = NOW[0] + interval
with traintel.application():
    with traintel.model_init():
        tick(5)
    with traintel.training_loop(train_iterations_start=0):
        for i in range(n):
            slow = 5 if jitter.random() < 0.005 else 1
            with traintel.training_iteration(samples=32, tokens=4096):
                with traintel.data_loading():
                    tick(step * 0.05 * slow)
                with traintel.model_forward():
                    tick(step * 0.3 * slow)
                with traintel.model_backward():
                    tick(step * 0.5 * slow)
                with traintel.optimizer_update():
                    tick(step * 0.15 * slow)
                traintel.record_metrics(loss=1.0 / (i + 1), lr=1e-3)
            if NOW[0] >= next_collect:
                collect = threading.Thread(target=meters.force_flush)
                collect.start()
                collect.join()
                next_collect += interval
traintel.shutdown()
"""
