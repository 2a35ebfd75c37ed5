"""Fitted readouts of stored token states. Arrays in (numpy or torch, any device), frozen result
dataclasses out; nothing here sees a model.

>>> from probes import PredictionResidual
>>> PredictionResidual(norm="rms").fit(X, next_ids, docs).result_.summary   # doctest: +SKIP

- ``PredictionResidual`` / ``prediction_residual``: the per-layer prediction residual of He & Su (2024)
  in closed form (held-out, in-sample and token-id variants, document bootstrap), ``pr_law_summary``.
- ``LinearProbe`` (+ Hewitt & Liang control task), ``ScalarMixProbe`` (ELMo), ``char_labels``.
- ``ContextMemoryProbe`` (LLM-Microscope context memory), ``aggregate_by_class``.
- ``KnnSenseProbe`` (leave-one-out cosine kNN sense accuracy), ``KnobProbe`` (direction per layer).
"""

from probes.context_memory import ContextMemoryProbe, ContextMemoryResult, aggregate_by_class
from probes.knn import KnnSenseProbe, KnnSenseResult, knn_sense_accuracy
from probes.knob import KnobProbe, KnobResult
from probes.linear_probe import LinearProbe, ProbeResult, char_labels, control_labels
from probes.pr_law import PRLawSummary, pr_law_summary
from probes.prediction_residual import (
    LayerPR,
    PredictionResidual,
    PredictionResidualResult,
    prediction_residual,
)
from probes.scalar_mix import ScalarMixProbe, ScalarMixResult

__all__ = [
    "PredictionResidual", "PredictionResidualResult", "LayerPR", "prediction_residual",
    "PRLawSummary", "pr_law_summary", "LinearProbe", "ProbeResult", "char_labels", "control_labels",
    "ScalarMixProbe", "ScalarMixResult", "ContextMemoryProbe", "ContextMemoryResult", "aggregate_by_class",
    "KnnSenseProbe", "KnnSenseResult", "knn_sense_accuracy", "KnobProbe", "KnobResult",
]
