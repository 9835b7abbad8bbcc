"""Serving a sentiment model: device choice, loading (dygraph or static backend), tokenization, long
reviews, model-directory metadata. Training lives in `worker.training`, which imports this package."""

from worker.model.classifier import DEFAULT_LABELS, SentimentClassifier
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
from worker.model.static_backend import StaticClassifier, is_exported_dir

__all__ = [
    "DEFAULT_LABELS",
    "METADATA_FILE",
    "DeviceChoice",
    "DeviceProbe",
    "DeviceUnavailableError",
    "ModelLoadError",
    "ModelMetadata",
    "PaddleDeviceProbe",
    "SentimentClassifier",
    "StaticClassifier",
    "activate",
    "choose_device",
    "is_exported_dir",
    "load_classifier",
]
