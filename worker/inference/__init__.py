"""The one labelling engine every entry point uses (the Kafka worker, `serve`, `predict`, the benchmarks).

Modules: `consume_window` (when a window of texts is labelled), `batch_plan` (how: token-budget,
length-grouped batches), `labelling` (the model on a window, split on failure), `label_fields` (a text's
label, confidence and probabilities, as every result carries them), `stage` (that work on an inference
thread of its own), `startup` (the one choice of the token budget, and a warm model, before anything is
labelled), and `tuning/` (the token-budget calibration).
"""

from worker.inference.label_fields import LabelFields, label_fields
from worker.inference.labelling import Classifier, InferenceFailure, TokenBudget, label_texts
from worker.inference.stage import InferenceStage
from worker.inference.startup import BudgetChoice, StartupError, choose_token_budget, token_budget

__all__ = [
    "BudgetChoice",
    "Classifier",
    "InferenceFailure",
    "InferenceStage",
    "LabelFields",
    "StartupError",
    "TokenBudget",
    "choose_token_budget",
    "label_fields",
    "label_texts",
    "token_budget",
]
