"""Span processors and the pure aggregation behind them (this package never imports torch)."""

from traintel.processor.aggregator import (
    CheckpointStats,
    EvalStats,
    RateInputs,
    TrainingAggregator,
    WindowReport,
)
from traintel.processor.export_filter import IterationExportFilter, TraceBudget
from traintel.processor.instruments import DURATION_BUCKETS_S, TrainingInstruments
from traintel.processor.sampling import IterationSampler
from traintel.processor.training_metrics import TrainingMetricsProcessor

__all__ = [
    "DURATION_BUCKETS_S",
    "CheckpointStats",
    "EvalStats",
    "IterationExportFilter",
    "IterationSampler",
    "RateInputs",
    "TraceBudget",
    "TrainingAggregator",
    "TrainingInstruments",
    "TrainingMetricsProcessor",
    "WindowReport",
]
