"""Run one script as N real ranks (torch.distributed over gloo on 127.0.0.1) and read their files."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.subprocess_helpers import clean_env
from traintel.exporters.reader import SpanRecord, iter_metric_requests, iter_spans

#: Every rank script starts with this: gloo over loopback, rank and world size from the env.
PRELUDE = """
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
RANK = dist.get_rank()
import traintel
"""

#: Like ``mp.spawn`` with explicit ranks: no RANK / WORLD_SIZE in the environment, and the script
#: itself calls ``init_process_group`` (tcp:// on MASTER_PORT) with ``RANK``, when it chooses.
SPAWN_PRELUDE = """
import os, sys, time
import torch
import torch.distributed as dist
RANK = int(os.environ["SPAWN_RANK"])
INIT = f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}"
import traintel
"""


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str
    seconds: float  # from launch to exit
    out_dir: Path

    def spans(self) -> list[SpanRecord]:
        return list(iter_spans(sorted(self.out_dir.glob("*.jsonl"))))

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e.attributes for s in self.spans() for e in s.events if e.name == name]

    def metric_names(self) -> set[str]:
        """Every metric this rank exported at least one point of."""
        return {
            metric.name
            for request in iter_metric_requests(sorted(self.out_dir.glob("*.jsonl")))
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if getattr(metric, metric.WhichOneof("data") or "gauge").data_points
        }

    def metric_points(self, name: str) -> list[tuple[int, dict[str, Any], float]]:
        """(time ns, attributes, value) of every exported point of metric ``name``."""
        from traintel.exporters.reader import attributes_dict

        points = []
        for request in iter_metric_requests(sorted(self.out_dir.glob("*.jsonl"))):
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if metric.name != name:
                            continue
                        data = metric.gauge if metric.HasField("gauge") else metric.sum
                        for p in data.data_points:
                            value = p.as_double if p.HasField("as_double") else float(p.as_int)
                            points.append((p.time_unix_nano, attributes_dict(p.attributes), value))
        return points


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(
    code: str,
    tmp_path: Path,
    world: int = 2,
    timeout: float = 90,
    spawn: bool = False,
    port: int | None = None,
    **env: str,
) -> list[RankResult]:
    """Start ``world`` ranks of ``PRELUDE + code`` (``spawn``: ``SPAWN_PRELUDE``) at once and
    wait for all (bounded). ``port``: the store's (default: a free one, rank 0 serves it)."""
    script = tmp_path / "rank.py"
    script.write_text((SPAWN_PRELUDE if spawn else PRELUDE) + textwrap.dedent(code))
    master_port = str(port or free_port())
    run_id = f"ranks-{master_port}"  # torchrun gives every rank the same TORCHELASTIC_RUN_ID
    procs = []
    started = time.monotonic()
    for rank in range(world):
        out_dir = tmp_path / f"rank{rank}"
        out_dir.mkdir()
        launcher = {"SPAWN_RANK": str(rank)} if spawn else {
            "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)
        }  # fmt: skip
        # the rank tests read each window's numbers from the full event, as the in-process tests
        rank_env = clean_env(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=master_port, TRAINTEL_OUTPUT_DIR=str(out_dir),
            OMP_NUM_THREADS="1",
            TORCHELASTIC_RUN_ID=run_id, TRAINTEL_WINDOW_EVENTS="on", **launcher, **env,
        )  # fmt: skip
        if spawn:  # not even the parent's
            for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
                rank_env.pop(name, None)
        procs.append(
            (
                out_dir,
                subprocess.Popen(
                    [sys.executable, str(script)],
                    cwd=tmp_path,
                    env=rank_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    results = []
    for rank, (out_dir, proc) in enumerate(procs):
        try:
            stdout, stderr = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            for _, other in procs:
                other.kill()
            raise
        results.append(RankResult(rank, proc.returncode, stdout, stderr, time.monotonic() - started, out_dir))
    return results
