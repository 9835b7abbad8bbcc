"""The one labelling engine every entry point uses (the Kafka worker, `serve`, `predict`, the benchmarks).

Modules: `consume_window` (when a window of texts is labelled), `batch_plan` (how: token-budget,
length-grouped batches), `labelling` (the model on a window, split on failure), `stage` (that work on an
inference thread of its own), `startup` (a token budget and a warm model before anything is labelled), and
`tuning/` (the token-budget calibration).
"""

from worker.inference.labelling import Classifier, InferenceFailure, TokenBudget, label_texts
from worker.inference.stage import InferenceStage
from worker.inference.startup import StartupError

__all__ = [
    "Classifier",
    "InferenceFailure",
    "InferenceStage",
    "StartupError",
    "TokenBudget",
    "label_texts",
]
