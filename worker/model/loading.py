"""Load a SentimentClassifier from a local ``save_pretrained`` directory or a PaddleNLP model name."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from worker.model.classifier import DEFAULT_LABELS, SentimentClassifier
from worker.model.device import DeviceChoice, activate
from worker.model.metadata import (
    CONFIG_FILES,
    METADATA_FILE,
    WEIGHT_FILES,
    ModelMetadata,
    find_weights,
    weights_version,
)

log = logging.getLogger(__name__)

HUB_DEFAULT_MAX_SEQ_LEN = 128
TRAIN_HINT = "pass a local model directory, e.g. one made by `sentiment-worker train`"


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message says what is wrong and what to do."""


def _looks_like_path(model: str) -> bool:
    return model.startswith((".", "/", "~")) or "/" in model or "\\" in model


def _check_dir(directory: Path) -> ModelMetadata | None:
    """Fail with a precise message if the directory can't hold a loadable model; return its metadata."""
    missing = []
    if not any((directory / name).is_file() for name in CONFIG_FILES):
        missing.append(" or ".join(CONFIG_FILES))
    if find_weights(directory) is None:
        missing.append(" or ".join(WEIGHT_FILES))
    if not (directory / "vocab.txt").is_file():
        missing.append("vocab.txt")
    if missing:
        raise ModelLoadError(
            f"model directory {directory} is incomplete: missing {', '.join(missing)}; "
            f"{TRAIN_HINT}, or re-run training into it"
        )
    for name in CONFIG_FILES:
        path = directory / name
        if path.is_file():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise ModelLoadError(
                    f"{path} is not valid JSON ({exc}); the directory is corrupt: {TRAIN_HINT}"
                ) from exc
    meta_path = directory / METADATA_FILE
    if not meta_path.is_file():
        return None
    try:
        return ModelMetadata.read(meta_path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{meta_path} is invalid ({exc}); fix or delete it, or re-run training") from exc


def _load_dir(directory: Path) -> tuple[Any, Any]:
    from paddlenlp.transformers import ErnieForSequenceClassification, ErnieTokenizer

    try:
        tokenizer = ErnieTokenizer.from_pretrained(str(directory))
    except Exception as exc:  # noqa: BLE001 - PaddleNLP raises many types; report them all the same way
        raise ModelLoadError(f"could not load the tokenizer from {directory}: {exc}; {TRAIN_HINT}") from exc
    try:
        model = ErnieForSequenceClassification.from_pretrained(str(directory))
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(
            f"could not load model weights from {directory} (corrupt or incompatible "
            f"{find_weights(directory)}?): {type(exc).__name__}: {exc}; {TRAIN_HINT}"
        ) from exc
    _check_weights_loaded(model, directory)
    return model, tokenizer


def _check_weights_loaded(model: Any, directory: Path) -> None:
    """PaddleNLP only warns on missing weights; an unloaded classifier would silently be random."""
    import paddle

    weights = find_weights(directory)
    if weights is None or weights.suffix != ".pdparams":
        return
    try:
        saved = paddle.load(str(weights), return_numpy=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"could not read {weights}: {exc}; the file is corrupt: {TRAIN_HINT}") from exc
    expected = set(model.state_dict().keys())
    absent = sorted(expected - set(saved.keys()))
    if absent:
        raise ModelLoadError(
            f"{weights} lacks {len(absent)} of the model's {len(expected)} weights (e.g. {absent[0]}); "
            f"it was not saved from an ErnieForSequenceClassification: {TRAIN_HINT}"
        )


def _load_hub(name: str) -> tuple[Any, Any]:
    from paddlenlp.transformers import ErnieForSequenceClassification, ErnieTokenizer

    try:
        model = ErnieForSequenceClassification.from_pretrained(name, num_classes=len(DEFAULT_LABELS))
        tokenizer = ErnieTokenizer.from_pretrained(name)
    except Exception as exc:  # noqa: BLE001 - download failures surface as many exception types
        raise ModelLoadError(
            f"could not download {name} (no access to the model hub?): {TRAIN_HINT} "
            f"[{type(exc).__name__}: {exc}]"
        ) from exc
    return model, tokenizer


def _max_position_embeddings(model: Any) -> int | None:
    config = getattr(model, "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None


def load_classifier(
    model: str, device: DeviceChoice, *, max_seq_len: int | None = None
) -> SentimentClassifier:
    """Load ``model`` (a local model directory or a PaddleNLP model name) onto ``device``.

    ``max_seq_len`` (tokens incl. [CLS]/[SEP]) defaults to the directory's ``sentiment_model.json`` value,
    else 128; it may not exceed the model's position embeddings. Raises ModelLoadError.
    """
    activate(device)
    directory = Path(model).expanduser()
    meta: ModelMetadata | None = None
    if directory.is_dir():
        meta = _check_dir(directory)
        net, tokenizer = _load_dir(directory)
        name = meta.name if meta is not None else directory.resolve().name
        version = weights_version(directory)
        if meta is not None and meta.version and meta.version != version:
            log.warning(
                "%s says version %s but the weights hash to %s; using the hash",
                METADATA_FILE,
                meta.version,
                version,
            )
        labels = meta.labels if meta is not None else list(DEFAULT_LABELS)
    elif directory.exists():
        raise ModelLoadError(f"model path {directory} is a file, not a directory: {TRAIN_HINT}")
    elif _looks_like_path(model):
        raise ModelLoadError(f"model directory {directory} does not exist: {TRAIN_HINT}")
    else:
        net, tokenizer = _load_hub(model)
        name, version, labels = model, model, list(DEFAULT_LABELS)

    num_labels = int(getattr(net, "num_labels", len(labels)))
    if num_labels != len(labels):
        raise ModelLoadError(f"model has {num_labels} outputs but {len(labels)} label names {labels}")
    limit = _max_position_embeddings(net)
    chosen = (
        max_seq_len if max_seq_len is not None else (meta.max_seq_len if meta else HUB_DEFAULT_MAX_SEQ_LEN)
    )
    if limit is not None and chosen > limit:
        if max_seq_len is not None:
            raise ModelLoadError(f"max_seq_len={max_seq_len} exceeds the model's {limit} position embeddings")
        chosen = limit
    return SentimentClassifier(
        model=net,
        tokenizer=tokenizer,
        name=name,
        version=version,
        labels=labels,
        max_seq_len=chosen,
        device=device,
    )
