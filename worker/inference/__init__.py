"""The one labelling engine every entry point uses (the Kafka worker, `serve`, `predict`, the benchmarks):
`Engine.submit(texts) -> Future[Labelled]` is its only door.

Modules: `engine` (one queue, token-budget batches on the model lanes, per-item failures), `in_order` (items
submitted and collected in submission order, bounded), `classifier` (what the engine labels with: the
classifier protocol, a text's sequences, one text's outcome), `model_calls` (one batch on the model, split
on failure; the running token budget; the measurements), `batch_plan` (token-budget, length-grouped
batches), `batch_shape` (how batches are bounded on the device: by tokens on a GPU), `label_fields` (a
text's label, confidence and probabilities, as every result carries them), `token_budget` (the one choice of
the budget) and `tuning/` (its calibration).
"""

from worker.inference.classifier import Classifier, InferenceFailure, Output
from worker.inference.engine import Engine, EngineClosed, EngineOptions, Labelled
from worker.inference.label_fields import LabelFields, label_fields
from worker.inference.model_calls import GroupStats
from worker.inference.token_budget import BudgetChoice, StartupError, choose_token_budget

__all__ = [
    "BudgetChoice",
    "Classifier",
    "Engine",
    "EngineClosed",
    "EngineOptions",
    "InferenceFailure",
    "LabelFields",
    "Labelled",
    "Output",
    "GroupStats",
    "StartupError",
    "choose_token_budget",
    "label_fields",
]
