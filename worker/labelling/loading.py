"""Loading the model a command serves, as the settings say: the device chosen (never a silent fallback: a
GPU asked for and not working is a configuration error), the directory or name loaded, and its identity."""

from __future__ import annotations

import logging

from schemas.sentiment_result import ModelRef
from worker.config import WorkerSettings
from worker.errors import ConfigurationError
from worker.model.classifier import TextClassifierBase
from worker.model.device import DeviceUnavailableError, activate, choose_device
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier

__all__ = ["load_model"]

log = logging.getLogger(__name__)


def load_model(settings: WorkerSettings) -> tuple[TextClassifierBase, ModelRef]:
    """The classifier and its ModelRef, built as the settings say: model, device, max_seq_len, backend
    (dynamic/static/onnx, or identity when allow_identity_model), tokenizer, long_text, cpu_threads,
    FP16/TensorRT."""
    try:
        choice = choose_device(settings.device)
    except DeviceUnavailableError as exc:
        raise ConfigurationError(f"device: {exc}") from None
    log.info("device %s (%s)", choice.paddle_device, choice.reason)
    activate(choice)
    try:
        classifier = load_classifier(
            settings.model,
            choice,
            max_seq_len=settings.max_seq_len,
            options=InferenceOptions.from_settings(settings),
        )
    except ModelLoadError as exc:
        raise ConfigurationError(f"model: {exc}") from None
    log.info("model %r", classifier)
    return classifier, ModelRef(name=classifier.name, version=classifier.version)
