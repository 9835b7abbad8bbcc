"""Loading a model the Labeller serves, as the settings say: the device chosen (never a silent fallback: a
GPU asked for and not working is a configuration error), the directory or name loaded, and its identity."""

from __future__ import annotations

import logging
from typing import NamedTuple

from schemas.sentiment_result import ModelRef
from worker.config import BatchingSettings, ModelSettings
from worker.errors import ConfigurationError
from worker.inference.classifier import Classifier
from worker.model.classifier import TextClassifierBase
from worker.model.device import DeviceUnavailableError, activate, choose_device
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier

__all__ = ["LoadedModel", "device_name", "load_classifier_for", "load_model"]

log = logging.getLogger(__name__)


class LoadedModel(NamedTuple):
    """A loaded model and its identity (name, version): what the Labeller serves; `path` the directory it
    was loaded from (None: a name, or a test's model)."""

    classifier: Classifier
    ref: ModelRef
    path: str | None = None

    @property
    def content_hash(self) -> str | None:
        """The sha256 of its directory's manifest (None: not loaded from a verified directory)."""
        value = getattr(self.classifier, "content_hash", None)
        return str(value) if value else None


def device_name(classifier: object) -> str:
    """The classifier's device as Paddle names it (`cpu`, `gpu:0`), or `unknown`."""
    device = getattr(classifier, "device", None)
    return str(getattr(device, "paddle_device", device) or "unknown")


def load_model(model: ModelSettings, batching: BatchingSettings) -> LoadedModel:
    """The model the model section names, and its identity (`load_classifier_for`)."""
    classifier = load_classifier_for(model, batching)
    return LoadedModel(classifier, ModelRef(name=classifier.name, version=classifier.version), model.model)


def load_classifier_for(model: ModelSettings, batching: BatchingSettings) -> TextClassifierBase:
    """The classifier built as the model section says: model, device, max_seq_len, backend (dynamic, static,
    onnx, or identity when allow_identity_model), tokenizer, long_text, cpu_threads, FP16/TensorRT (whose
    largest batch is batching's max_batch_size). The device is chosen and activated first; a GPU asked for
    and not working, or a model that cannot load, is a ConfigurationError saying what to do."""
    try:
        choice = choose_device(model.device)
    except DeviceUnavailableError as exc:
        raise ConfigurationError(f"device: {exc}") from None
    log.info("device %s (%s)", choice.paddle_device, choice.reason)
    activate(choice)
    try:
        classifier = load_classifier(
            model.model,
            choice,
            max_seq_len=model.max_seq_len,
            options=InferenceOptions.from_settings(model, batching),
        )
    except ModelLoadError as exc:
        raise ConfigurationError(f"model: {exc}") from None
    log.info("model %r, content sha256 %s", classifier, classifier.content_hash or "- (not a directory)")
    return classifier
