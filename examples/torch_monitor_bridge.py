"""Code already instrumented with ``torch.monitor`` lands in the same OTel backends.

    python examples/torch_monitor_bridge.py

Each ``torch.monitor.log_event`` becomes a span event on the span current where it was logged,
and each ``Stat`` window sets the ``ml.training.torch_monitor.stat`` gauge (one series per stat
and aggregation).
"""

from __future__ import annotations

import datetime
import time

import torch.monitor

import traintel
from traintel.integrations.torch_monitor import bridge_torch_monitor

step_time = torch.monitor.Stat(
    "step_ms",
    [torch.monitor.Aggregation.MEAN, torch.monitor.Aggregation.MAX],
    datetime.timedelta(seconds=60),
    10,  # a window of 10 samples
)


def main() -> None:
    bridge = bridge_torch_monitor()
    with traintel.application(), traintel.training_loop():
        for step in range(30):
            with traintel.training_iteration():
                started = time.perf_counter()
                time.sleep(0.001)
                step_time.add((time.perf_counter() - started) * 1000)
                if step == 15:
                    torch.monitor.log_event(
                        torch.monitor.Event("lr_drop", datetime.datetime.now(), {"step": step, "factor": 0.1})
                    )
    bridge.uninstall()
    print("spans written to", traintel.get_telemetry().output_file)


if __name__ == "__main__":
    main()
