"""The per-step path repeats a few constructors inline to save a Python call each (one per
step phase); these tests keep each copy and the function it repeats building the same thing."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN_CONTEXT

import traintel
from traintel._recorder import phases
from traintel._recorder.engine import iteration_record
from traintel._runtime import state as _state

_UNSET = object()


def _slots(obj: object) -> dict[str, Any]:
    names = [slot for cls in type(obj).__mro__ for slot in getattr(cls, "__slots__", ())]
    return {name: getattr(obj, name, _UNSET) for name in names}


def test_inline_factories_build_what_their_helpers_build() -> None:
    assert _slots(traintel.training_iteration()) == _slots(
        phases._iteration_phase(phases._TRAINING_ITERATION, None, phases._EMPTY)
    )
    for factory, name in (
        (traintel.data_loading, phases._DATA_LOADING),
        (traintel.model_forward, phases._MODEL_FORWARD),
        (traintel.model_backward, phases._MODEL_BACKWARD),
        (traintel.optimizer_update, phases._OPTIMIZER_UPDATE),
    ):
        assert _slots(factory()) == _slots(
            phases._step_phase(name, phases._STEP_ATTRIBUTES[name], phases.STEP_INDEX[name])
        )


def test_the_inlined_enter_and_record_match_the_general_path() -> None:
    """``_Iteration.__enter__``'s common case repeats ``_open``, and ``begin_iteration``
    repeats ``iteration_record``: same fields set, on the phase object and on the record."""
    traintel.configure(
        span_exporters=[InMemorySpanExporter()], metric_readers=[], export_first_iterations=0,
        export_every_n_iterations=0,
    )  # fmt: skip
    try:
        telemetry = _state.current()
        with traintel.training_loop():
            fast = traintel.training_iteration()
            with fast as fast_record:
                fast_state = {k: type(v) for k, v in _slots(fast).items()}
            general = traintel.training_iteration()
            general_record = general._open(telemetry)
            general_state = {k: type(v) for k, v in _slots(general).items()}
            general._close(telemetry, None)
        assert fast_state == general_state
        assert set(vars(fast_record)) == set(vars(general_record))
        plain = iteration_record(phases._TRAINING_ITERATION, 0, 0, INVALID_SPAN_CONTEXT)
        assert set(vars(plain)) <= set(vars(fast_record))
        assert set(vars(fast_record)) - set(vars(plain)) == {"sampled", "end_ns", "context"}
    finally:
        traintel.shutdown(2)
