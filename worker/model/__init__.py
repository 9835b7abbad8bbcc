"""Serving a sentiment model: device choice, loading (dygraph, static or ONNX Runtime backend, the measured
auto choice; the identity backend, which does no inference, for measuring the host path), tokenization, long
reviews, model-directory metadata. Training lives in `worker.training`, which imports this package."""

from worker.model.backend_choice import MEASUREMENT_FILE, BackendMeasurement, BackendResult
from worker.model.classifier import DEFAULT_LABELS, SentimentClassifier
from worker.model.device import (
    DeviceChoice,
    DeviceProbe,
    DeviceUnavailableError,
    PaddleDeviceProbe,
    activate,
    choose_device,
)
from worker.model.identity_backend import IDENTITY_MODEL_NAME, IdentityClassifier
from worker.model.loading import ModelLoadError, load_classifier
from worker.model.metadata import METADATA_FILE, ModelMetadata
from worker.model.onnx_backend import OnnxClassifier, is_onnx_dir
from worker.model.static_backend import StaticClassifier, is_exported_dir

__all__ = [
    "DEFAULT_LABELS",
    "IDENTITY_MODEL_NAME",
    "MEASUREMENT_FILE",
    "METADATA_FILE",
    "BackendMeasurement",
    "BackendResult",
    "DeviceChoice",
    "DeviceProbe",
    "DeviceUnavailableError",
    "IdentityClassifier",
    "ModelLoadError",
    "ModelMetadata",
    "OnnxClassifier",
    "PaddleDeviceProbe",
    "SentimentClassifier",
    "StaticClassifier",
    "activate",
    "choose_device",
    "is_exported_dir",
    "is_onnx_dir",
    "load_classifier",
]
