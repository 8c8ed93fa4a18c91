"""Zero-code instrumentation: an unmodified script under ``opentelemetry-instrument``, and the
patches' exact removal."""

from __future__ import annotations

import datetime
import itertools
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.monitor
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from tests.conftest import Pipeline, parent_name
from tests.subprocess_helpers import REPO, clean_env, run_python
from traintel import semconv
from traintel._aggregation.window_record import expand
from traintel.exporters.reader import SpanRecord, iter_spans
from traintel.instrumentation import TraintelInstrumentor

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py

SCRIPT = REPO / "examples" / "zero_code_train.py"


def _run_instrumented(
    tmp_path: Path, *script_args: str
) -> tuple[subprocess.CompletedProcess[str], list[SpanRecord]]:
    instrument = str(Path(sys.executable).parent / "opentelemetry-instrument")
    result = subprocess.run(
        [instrument, sys.executable, str(SCRIPT), "--checkpoint-dir", str(tmp_path), *script_args],
        cwd=tmp_path,
        env=clean_env(
            OTEL_TRACES_EXPORTER="traintel_file",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            TRAINTEL_OUTPUT_DIR=str(tmp_path / "out"),
            TRAINTEL_EXPORT_ITERATIONS="all",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result, list(iter_spans([tmp_path / "out"]))


def _parent(span: SpanRecord, spans: list[SpanRecord]) -> str | None:
    by_id = {s.span_id: s.name for s in spans}
    return by_id.get(span.parent_span_id) if span.parent_span_id else None


def test_unmodified_script_gets_iterations_data_loading_and_checkpoints(tmp_path: Path) -> None:
    result, spans = _run_instrumented(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "reloaded step 16" in result.stdout
    assert Counter(s.name for s in spans) == {
        "application": 1,
        "training_loop": 1,
        "training_iteration": 16,  # 2 epochs x 8 optimizer steps; validation batches are not steps
        "data_loading": 16,
        "optimizer_update": 16,
        "checkpoint_save_sync": 1,
        "checkpoint_load": 1,
        "training_window": 1,
    }
    expected_parent = {
        "application": None,
        "training_loop": "application",
        "training_iteration": "training_loop",
        "data_loading": "training_iteration",
        "optimizer_update": "training_iteration",
        "checkpoint_save_sync": "training_loop",
        "checkpoint_load": "training_loop",
        "training_window": "training_loop",
    }
    for span in spans:
        assert _parent(span, spans) == expected_parent[span.name], span.name
        assert not span.is_error
    iterations = sorted((s for s in spans if s.name == "training_iteration"), key=lambda s: s.start_ns)
    assert [s.attributes[semconv.ITERATION] for s in iterations] == list(range(16))
    assert all(s.attributes[semconv.SAMPLES] == 16 for s in iterations)
    assert all(s.attributes[semconv.INTEGRATION] == "instrumentor" for s in iterations)
    # each iteration ends when its optimizer step returns and the next starts there (same epoch)
    steps = sorted((s for s in spans if s.name == "optimizer_update"), key=lambda s: s.start_ns)
    assert [s.end_ns for s in steps] == [s.end_ns for s in iterations]
    for previous, following in itertools.pairwise(iterations[:8]):
        assert following.start_ns == previous.end_ns
    # the epoch boundary (validation under no_grad) is not counted in the next iteration
    assert iterations[8].start_ns > iterations[7].end_ns
    save = next(s for s in spans if s.name == "checkpoint_save_sync")
    assert save.attributes[semconv.CHECKPOINT_PATH] == str(tmp_path / "model.pt")
    assert save.attributes[semconv.CHECKPOINT_SIZE] == (tmp_path / "model.pt").stat().st_size
    assert save.attributes[semconv.INSTRUMENTED_CALL] == "torch.save"
    load = next(s for s in spans if s.name == "checkpoint_load")
    assert load.attributes[semconv.INSTRUMENTED_CALL] == "torch.load"
    # the processor's throughput comes from the DataLoader's batch sizes, exactly
    window = expand(next(s for s in spans if s.name == "training_window").attributes)
    total_time = sum(s.end_ns - s.start_ns for s in iterations) / 1e9
    assert window[semconv.WINDOW_PREFIX + "samples"] == 256
    assert window[semconv.WINDOW_PREFIX + "samples_per_second"] == pytest.approx(256 / total_time, rel=1e-9)


def test_an_exception_in_a_step_marks_the_open_spans_and_exits_unchanged(tmp_path: Path) -> None:
    result, spans = _run_instrumented(tmp_path, "--fail-at-step", "3")
    assert result.returncode == 1
    assert "RuntimeError: failing at step 3 as asked" in result.stderr
    assert "traintel" not in result.stderr.split("Traceback")[-1].split("\n", 1)[0]
    errors = {s.name for s in spans if s.is_error}
    assert errors == {"application", "training_loop", "training_iteration"}
    failed = next(s for s in spans if s.name == "training_iteration" and s.is_error)
    assert failed.attributes[semconv.ITERATION] == 3
    assert "failing at step 3" in failed.status_message


def _patched_objects() -> dict[str, object]:
    return {
        "torch.save": torch.save,
        "torch.load": torch.load,
        "__next__": vars(_BaseDataLoaderIter)["__next__"],
        "dcp.save": dcp.save,
        "dcp.async_save": dcp.async_save,
        "dcp.load": dcp.load,
    }


def _global_step_hooks() -> tuple[int, int]:
    from torch.optim import optimizer

    return len(optimizer._global_optimizer_pre_hooks), len(optimizer._global_optimizer_post_hooks)


def test_uninstrument_restores_every_patched_function_exactly(pipeline: Pipeline, tmp_path: Path) -> None:
    before = _patched_objects()
    hooks_before = _global_step_hooks()
    instrumentor = TraintelInstrumentor()
    instrumentor.instrument()
    try:
        during = _patched_objects()
        assert all(during[name] is not before[name] for name in before), "everything is patched"
        assert _global_step_hooks() == (hooks_before[0] + 1, hooks_before[1] + 1)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for (x,) in DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4):
            model(x).sum().backward()
            optimizer.step()
        state = {"weight": model.weight.detach().clone()}
        dcp.save(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
        future = dcp.async_save(state, checkpoint_id=str(tmp_path / "dcp_async"), no_dist=True)
        getattr(future, "upload_completion", future).result(timeout=60)
        dcp.load(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
        torch.monitor.log_event(torch.monitor.Event("while_instrumented", datetime.datetime.now(), {}))
    finally:
        instrumentor.uninstrument()
    torch.monitor.log_event(torch.monitor.Event("after_uninstrument", datetime.datetime.now(), {}))
    after = _patched_objects()
    assert all(after[name] is before[name] for name in before), "every original is back, by identity"
    assert _global_step_hooks() == hooks_before
    spans = pipeline.spans()
    names = Counter(s.name for s in spans)
    assert names["training_iteration"] == 2
    saves = (names["checkpoint_save_sync"], names["checkpoint_save_async"], names["checkpoint_load"])
    assert saves == (1, 1, 1)
    assert names["checkpoint_finalize"] == 1  # the async save's background half, finished by its future
    # DCP writes with torch.save internally: that is not a second checkpoint
    for span in spans:
        if span.name.startswith("checkpoint_") and span.name != "checkpoint_finalize":
            assert span.attributes is not None
            assert str(span.attributes[semconv.INSTRUMENTED_CALL]).startswith("torch.distributed.checkpoint.")
            assert parent_name(span, spans) == "training_loop"
    events = [e.name for s in spans for e in s.events]
    assert "while_instrumented" in events, "the torch.monitor bridge is part of instrumentation"
    assert "after_uninstrument" not in events
    size = pipeline.one("checkpoint_save_sync").attributes[semconv.CHECKPOINT_SIZE]  # type: ignore[index]
    assert size == sum(p.stat().st_size for p in (tmp_path / "dcp").rglob("*") if p.is_file())


def test_the_base_install_imports_no_framework(tmp_path: Path) -> None:
    code = (
        "import sys, traintel, traintel.integrations, traintel.instrumentation\n"
        "frameworks = ('lightning', 'pytorch_lightning', 'transformers', 'torch')\n"
        "print(sorted(m for m in frameworks if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_torch_and_dcp_are_patched_when_the_script_imports_them_and_restored(tmp_path: Path) -> None:
    code = """
    import sys
    import traintel
    from traintel.instrumentation import TraintelInstrumentor
    traintel.configure(span_exporters=[], metric_readers=[])
    instrumentor = TraintelInstrumentor()
    instrumentor.instrument()
    print("imported at start:", "torch" in sys.modules)
    import torch
    original_save = torch.save.__wrapped__
    import torch.distributed.checkpoint as dcp
    original = dcp.state_dict_saver.save
    print("patched on import:", dcp.save is not original)
    instrumentor.uninstrument()
    print("restored:", dcp.save is original, torch.save is original_save)
    """
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == [
        "imported at start: False",
        "patched on import: True",
        "restored: True True",
    ]


def test_a_missing_framework_names_the_extra_to_install(tmp_path: Path) -> None:
    code = """
    import sys
    sys.modules["transformers"] = None  # as if it were not installed
    try:
        import traintel.integrations.transformers
    except ImportError as exc:
        print(exc)
    """
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pip install 'traintel[transformers]'" in result.stdout
