"""Load a classifier: dygraph from a training directory (model.safetensors) or, when allowed, a PaddleNLP
model name, static from a ``sentiment-worker export`` directory, onnx from an ONNX export or INT8
quantization, identity (no inference, only when allowed) from any of them; with the chosen tokenizer
(fast/slow) and long-text layout. Every directory is verified against its manifest before anything in it is
read (worker.model.manifest); the classifier carries the directory's content hash."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from worker.errors import ConfigurationError
from worker.model.backend_choice import measured_choice
from worker.model.classifier import (
    DEFAULT_LABELS,
    ExportedParts,
    OutputWidthError,
    SentimentClassifier,
    TextClassifierBase,
)
from worker.model.device import DeviceChoice, activate
from worker.model.fast_tokenizer import (
    ContentTokenizer,
    SpecialIds,
    TokenizerKind,
    choose_tokenizer,
    load_checked_fast_tokenizer,
)
from worker.model.identity_backend import IDENTITY_MODEL_NAME, IdentityClassifier
from worker.model.long_text import LongTextMode, SequenceEncoder
from worker.model.manifest import UnverifiedModelError, VerifiedModel, verify_model_dir
from worker.model.metadata import (
    CONFIG_FILES,
    METADATA_FILE,
    WEIGHT_FILES,
    ModelMetadata,
    find_weights,
    weights_version,
)
from worker.model.onnx_backend import (
    ONNX_FILE,
    PRECISIONS,
    OnnxClassifier,
    OnnxOptions,
    is_onnx_dir,
    make_session,
)
from worker.model.static_backend import (
    GRAPH_FILES,
    PARAMS_FILE,
    StaticClassifier,
    StaticOptions,
    cpu_has_bf16,
    graph_file,
    is_exported_dir,
    make_config,
)
from worker.model.weights import build_classifier, load_tokenizer

if TYPE_CHECKING:
    from worker.config import BatchingSettings, ModelSettings

log = logging.getLogger(__name__)

Backend = Literal["auto", "dynamic", "static", "onnx", "identity"]
ServingBackend = Literal["dynamic", "static", "onnx"]

HUB_DEFAULT_MAX_SEQ_LEN = 128
TRAIN_HINT = "pass a local model directory, e.g. one made by `sentiment-worker train`"


DERIVED_SUFFIXES = {
    "-int8": {"default": "make model", "fast": "make fast-model-int8"},
    "-onnx": {"default": "make model", "fast": "make fast-model-int8"},
    "-static": {"default": "make model-static", "fast": "make fast-model-static"},
}
"""Served forms `make` derives next to a model directory (models/default-int8 from models/default), and the
named targets of the shipped ones; any other directory D has the pattern rule `make D-int8/model.onnx`."""


def _missing_hint(directory: Path) -> str:
    for suffix, targets in DERIVED_SUFFIXES.items():
        source = directory.with_name(directory.name.removesuffix(suffix))
        if directory.name.endswith(suffix) and source.is_dir():
            rule = "sentiment_model.json" if suffix == "-static" else "model.onnx"
            target = targets.get(source.name, f"make {directory}/{rule}")
            return f"it is derived from {source}: run `{target}` (or `sentiment-worker export` / `quantize`)"
    return TRAIN_HINT


class ModelLoadError(ConfigurationError):
    """The model could not be loaded; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class InferenceOptions:
    """How to run a model: backend, tokenizer, long-text layout, and the static predictor's switches.

    ``backend=auto``: the fastest safe backend recorded in the directory by ``compare-backends --record``
    (see worker.model.backend_choice); without one, static when the directory is a Paddle export, onnx when
    it holds only an ONNX model, else dynamic. ``cpu_threads`` None: all cores. ``max_batch_size`` bounds
    TensorRT's dynamic shapes. ``backend=identity`` (no inference: see worker.model.identity_backend) is
    refused unless ``allow_identity``; a PaddleNLP model name (downloaded and unpickled by PaddleNLP) unless
    ``allow_hub``.
    """

    backend: Backend = "auto"
    tokenizer: TokenizerKind = "auto"
    long_text: LongTextMode = "head_tail"
    chunk_stride_tokens: int | None = None
    cpu_threads: int | None = None
    cpu_threads_per_call: int = 1
    use_fp16: bool = False
    use_tensorrt: bool = False
    use_bf16: bool = False
    max_batch_size: int = 32
    allow_identity: bool = False
    allow_hub: bool = False

    @classmethod
    def from_settings(cls, model: ModelSettings, batching: BatchingSettings) -> InferenceOptions:
        """The options the model section asks for (TensorRT's largest batch: batching's max_batch_size)."""
        return cls(
            backend=model.backend,
            tokenizer=model.tokenizer,
            long_text=model.long_text,
            chunk_stride_tokens=model.chunk_stride_tokens,
            cpu_threads=model.cpu_threads,
            cpu_threads_per_call=model.cpu_threads_per_call,
            use_fp16=model.use_fp16,
            use_tensorrt=model.use_tensorrt,
            use_bf16=model.use_bf16,
            max_batch_size=batching.max_batch_size,
            allow_identity=model.allow_identity_model,
            allow_hub=model.allow_hub_model,
        )


def available_backends(directory: Path) -> set[str]:
    """The backends whose files ``directory`` holds: dynamic (weights), static (Paddle export), onnx."""
    found = set()
    if find_weights(directory) is not None:
        found.add("dynamic")
    if is_exported_dir(directory):
        found.add("static")
    if is_onnx_dir(directory):
        found.add("onnx")
    return found


def resolve_backend(directory: Path | None, requested: Backend) -> ServingBackend:
    """The backend for a model directory (None: a hub name); raises ModelLoadError on a mismatch. Never the
    identity backend, which serves no model (`load_classifier` loads it when asked for by name)."""
    if requested == "identity":
        raise ModelLoadError("backend=identity serves no model: it is loaded only by its name, when allowed")
    available = available_backends(directory) if directory is not None else {"dynamic"}
    if directory is not None and not available:
        _check_exported_files(directory)
    if requested == "auto":
        if directory is not None:
            choice, why = measured_choice(directory, available)
            if choice is not None:
                log.info("backend %s for %s: %s", choice, directory, why)
                return choice  # type: ignore[return-value]
        if "static" in available:
            return "static"
        return "onnx" if available == {"onnx"} else "dynamic"
    if requested == "static" and "static" not in available:
        where = (
            f"{directory} is not an exported model directory" if directory else "a hub name is not exported"
        )
        hint = ", or set SENTIMENT_BACKEND=onnx (it holds an ONNX model)" if "onnx" in available else ""
        raise ModelLoadError(
            f"backend=static but {where}: run `sentiment-worker export --model {directory or 'MODEL'} "
            f"--output-dir DIR` and point SENTIMENT_MODEL at DIR, or set SENTIMENT_BACKEND=dynamic{hint}"
        )
    if requested == "onnx" and "onnx" not in available:
        where = f"{directory} has no {ONNX_FILE}" if directory else "a hub name has no ONNX export"
        raise ModelLoadError(
            f"backend=onnx but {where}: run `sentiment-worker export --format onnx --model TRAINING_DIR "
            "--output-dir DIR` (or `sentiment-worker quantize` on such a DIR) and point SENTIMENT_MODEL at it"
        )
    if requested == "dynamic" and directory is not None and available and "dynamic" not in available:
        kinds = " and ".join(sorted(available - {"dynamic"}))
        raise ModelLoadError(
            f"backend=dynamic but {directory} holds only an exported inference model ({kinds}, no dygraph "
            f"weights): set SENTIMENT_BACKEND={sorted(available)[0]} or auto, or point SENTIMENT_MODEL at "
            "the training directory"
        )
    return requested


def _check_exported_files(directory: Path) -> None:
    """A directory holding no servable model whose metadata says it was exported (an ``onnx`` or
    ``export`` section): name the exported file that is gone, rather than the training files it never had."""
    onnx, export = _metadata_section(directory, "onnx"), _metadata_section(directory, "export")
    missing = [ONNX_FILE] if onnx else []  # not servable, so ONNX_FILE is absent
    if export and graph_file(directory) is None:
        missing.append(" or ".join(GRAPH_FILES))
    if export and not (directory / PARAMS_FILE).is_file():
        missing.append(PARAMS_FILE)
    if missing:
        kind = "an ONNX model" if onnx else "an exported model"
        raise ModelLoadError(
            f"model directory {directory} is incomplete: its {METADATA_FILE} describes {kind} but "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing; copy the whole "
            "directory again, or re-run the export (`sentiment-worker export` / `quantize`) into it"
        )


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
    return _read_meta(directory, made_by="training")


def _verified(directory: Path) -> VerifiedModel:
    """The directory checked against its manifest: the first thing done with a model directory."""
    try:
        return verify_model_dir(directory)
    except UnverifiedModelError as exc:
        raise ModelLoadError(str(exc)) from None


def _load_dir(verified: VerifiedModel) -> tuple[Any, Any]:
    directory = verified.directory
    try:
        tokenizer = load_tokenizer(directory)
    except Exception as exc:  # noqa: BLE001 - PaddleNLP raises many types; report them all the same way
        raise ModelLoadError(f"could not load the tokenizer from {directory}: {exc}; {TRAIN_HINT}") from exc
    try:
        model = build_classifier(verified)
    except UnverifiedModelError as exc:
        raise ModelLoadError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - Paddle raises its own types for weights that do not fit
        raise ModelLoadError(
            f"could not load model weights from {directory} (corrupt or incompatible "
            f"{find_weights(directory)}?): {type(exc).__name__}: {exc}; {TRAIN_HINT}"
        ) from exc
    return model, tokenizer


HUB_REFUSAL = (
    "names a PaddleNLP model, which PaddleNLP downloads and unpickles (code from the model hub would run "
    "here): serve a local model directory (`sentiment-worker train --init {name}` writes one, with its "
    "manifest), or set SENTIMENT_ALLOW_HUB_MODEL=true to load it on purpose"
)


def _load_hub(name: str, options: InferenceOptions) -> tuple[Any, Any]:
    if not options.allow_hub:
        raise ModelLoadError(f"{name} {HUB_REFUSAL.format(name=name)}")
    from paddlenlp.transformers import ErnieForSequenceClassification, ErnieTokenizer

    log.warning("loading %s from PaddleNLP's model hub (allowed by SENTIMENT_ALLOW_HUB_MODEL)", name)
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


def load_dygraph(directory: Path) -> tuple[Any, Any, ModelMetadata | None]:
    """(ErnieForSequenceClassification, ErnieTokenizer, metadata) of a training directory, verified against
    its manifest first."""
    verified = _verified(directory)
    meta = _check_dir(directory)
    net, tokenizer = _load_dir(verified)
    return net, tokenizer, meta


def _encoder(tokenizer: Any, max_seq_len: int, options: InferenceOptions) -> SequenceEncoder:
    """The layout over the tokenizer `options.tokenizer` chooses given PaddleNLP's `tokenizer`."""
    try:
        content = choose_tokenizer(tokenizer, options.tokenizer)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from exc
    return _layout(content, SpecialIds.of(tokenizer), max_seq_len, options)


def _layout(
    content: ContentTokenizer, ids: SpecialIds, max_seq_len: int, options: InferenceOptions
) -> SequenceEncoder:
    try:
        return SequenceEncoder(
            content,
            cls_id=ids.cls,
            sep_id=ids.sep,
            max_seq_len=max_seq_len,
            mode=options.long_text,
            stride=options.chunk_stride_tokens,
        )
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from exc


def load_classifier(
    model: str,
    device: DeviceChoice,
    *,
    max_seq_len: int | None = None,
    options: InferenceOptions | None = None,
) -> TextClassifierBase:
    """Load ``model`` (a training or exported directory, or a PaddleNLP model name) onto ``device``.

    A directory is verified against its manifest before anything in it is read (a pickle, a file not
    listed or changed: ModelLoadError saying what to do); the classifier's ``content_hash`` is its content
    hash (None for a hub name).

    ``max_seq_len`` (tokens incl. [CLS]/[SEP]) defaults to the directory's ``sentiment_model.json`` value,
    else 128; it may not exceed the model's position embeddings. The backend, tokenizer and long-text
    layout come from ``options`` (default: auto, auto, head_tail). Raises ModelLoadError.
    """
    options = options or InferenceOptions()
    activate(device)
    directory = Path(model).expanduser()
    if _looks_like_path(model) and not directory.exists():
        raise ModelLoadError(f"model directory {directory} does not exist: {_missing_hint(directory)}")
    verified = _verified(directory) if directory.is_dir() else None
    if options.backend == "identity":
        identity = _load_identity(model, directory, device, max_seq_len, options)
        _check_outputs(identity, "the identity model")
        identity.content_hash = verified.content_hash if verified is not None else None
        return identity
    backend = resolve_backend(directory if directory.is_dir() else None, options.backend)
    if backend == "static":
        classifier = _load_static(directory, device, max_seq_len, options)
    elif backend == "onnx":
        classifier = _load_onnx(directory, device, max_seq_len, options)
    else:
        classifier = _load_dygraph(model, verified, device, max_seq_len, options)
    meta_file = directory / METADATA_FILE
    _check_outputs(classifier, meta_file if meta_file.is_file() else "the default labels")
    classifier.content_hash = verified.content_hash if verified is not None else None
    return classifier


PROBE_TEXT = "好"
"""The text a model labels once while loading, to check that it gives one output per label name."""


def _check_outputs(classifier: TextClassifierBase, source: Path | str) -> None:
    """Labels one probe text: the model must give as many outputs per text as ``source`` (the metadata
    file, or "the default labels") names labels. A mismatch would otherwise warm up, report ready, and
    then fail or misname every input."""
    labels = classifier.labels
    try:
        classifier.predict_ids(classifier.token_ids([PROBE_TEXT]))
    except OutputWidthError as exc:
        outputs = f"{exc.width} outputs per text" if exc.width is not None else f"outputs shaped {exc}"
        raise ModelLoadError(
            f"{source} names {len(labels)} labels {labels} but the model gives {outputs}: list one label "
            "name per output, in the order the model was trained with"
        ) from None


def _load_dygraph(
    model: str,
    verified: VerifiedModel | None,
    device: DeviceChoice,
    max_seq_len: int | None,
    options: InferenceOptions,
) -> TextClassifierBase:
    """A verified training directory or a PaddleNLP hub name (when allowed) → SentimentClassifier (Paddle's
    dynamic graph)."""
    meta: ModelMetadata | None = None
    directory = Path(model).expanduser()
    if verified is not None:
        meta = _check_dir(directory)
        net, tokenizer = _load_dir(verified)
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
        raise ModelLoadError(f"model directory {directory} does not exist: {_missing_hint(directory)}")
    else:
        net, tokenizer = _load_hub(model, options)
        name, version, labels = model, model, list(DEFAULT_LABELS)

    num_labels = int(getattr(net, "num_labels", len(labels)))
    if num_labels != len(labels):
        source = directory / METADATA_FILE if meta is not None else "the default labels"
        raise ModelLoadError(
            f"{source} names {len(labels)} labels {labels} but the model gives {num_labels} outputs per "
            "text: list one label name per output, in the order the model was trained with"
        )
    chosen = _choose_max_seq_len(max_seq_len, meta, _max_position_embeddings(net))
    return SentimentClassifier(
        model=net,
        tokenizer=tokenizer,
        name=name,
        version=version,
        labels=labels,
        max_seq_len=chosen,
        device=device,
        encoder=_encoder(tokenizer, chosen, options),
    )


def _load_static(
    directory: Path, device: DeviceChoice, max_seq_len: int | None, options: InferenceOptions
) -> TextClassifierBase:
    """An exported directory → StaticClassifier. Its version is the exported weights' version (recorded by
    export in sentiment_model.json), so results name the same model version on both backends."""
    parts = _exported_parts(directory, max_seq_len, directory / PARAMS_FILE, "exported", options)
    chosen = parts.max_seq_len
    static_options = StaticOptions(
        cpu_threads=options.cpu_threads or os.cpu_count() or 1,
        use_fp16=options.use_fp16,
        use_tensorrt=options.use_tensorrt,
        use_bf16=options.use_bf16 and device.kind == "cpu",
        max_batch_size=options.max_batch_size,
    )
    if static_options.use_bf16 and not cpu_has_bf16():
        raise ModelLoadError(
            "use_bf16 needs a CPU with native bfloat16 (AVX512-BF16 or AMX) and this one has none: "
            "unset SENTIMENT_USE_BF16"
        )
    try:
        from paddle import inference

        predictor = inference.create_predictor(make_config(directory, device, static_options, chosen))
    except Exception as exc:  # noqa: BLE001 - Paddle raises its own error types for corrupt graphs
        raise ModelLoadError(
            f"could not create a Paddle Inference predictor from {directory}: {type(exc).__name__}: {exc}; "
            "re-run `sentiment-worker export`"
        ) from exc
    return StaticClassifier(predictor=predictor, parts=parts, device=device, options=static_options)


def _load_onnx(
    directory: Path, device: DeviceChoice, max_seq_len: int | None, options: InferenceOptions
) -> TextClassifierBase:
    """An ONNX directory → OnnxClassifier. Version and precision come from sentiment_model.json (an INT8
    model names its own version, so results say which precision labelled them)."""
    parts = _exported_parts(directory, max_seq_len, directory / ONNX_FILE, "ONNX", options)
    onnx_options = OnnxOptions(
        cpu_threads=options.cpu_threads or os.cpu_count() or 1, threads_per_call=options.cpu_threads_per_call
    )
    try:
        session = make_session(directory / ONNX_FILE, device, onnx_options)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own error types for corrupt graphs
        raise ModelLoadError(
            f"could not create an ONNX Runtime session from {directory / ONNX_FILE}: "
            f"{type(exc).__name__}: {exc}; re-run `sentiment-worker export --format onnx`"
        ) from exc
    precision = _metadata_section(directory, "onnx").get("precision", "float32")
    if precision not in PRECISIONS:
        raise ModelLoadError(
            f"{directory / METADATA_FILE}: 'onnx.precision' must be one of {', '.join(PRECISIONS)}, not "
            f"{json.dumps(precision)[:40]}; re-run the export"
        )
    try:
        return OnnxClassifier(
            session=session,
            device=device,
            options=onnx_options,
            precision=precision,
            parts=parts,
        )
    except ValueError as exc:
        raise ModelLoadError(f"{directory}: {exc}; re-run the export") from exc


IDENTITY_REFUSAL = (
    "backend=identity does no inference (fixed probabilities, meaningless labels: an instrument for "
    "`sentiment-worker bench --host-ceiling`): set SENTIMENT_ALLOW_IDENTITY_MODEL=true to run it on purpose, "
    "or choose a real backend (SENTIMENT_BACKEND=auto)"
)


def _load_identity(
    model: str, directory: Path, device: DeviceChoice, max_seq_len: int | None, options: InferenceOptions
) -> TextClassifierBase:
    """Any model directory → IdentityClassifier: its tokenizer (the checked fast one an export saved, else
    PaddleNLP's as `tokenizer` says), max_seq_len and labels, no model. Refused unless `allow_identity`."""
    if not options.allow_identity:
        raise ModelLoadError(IDENTITY_REFUSAL)
    if not directory.is_dir():
        raise ModelLoadError(
            f"backend=identity takes its tokenizer from a model directory, and {model} is not one: point "
            "SENTIMENT_MODEL at a model directory (e.g. models/default-int8)"
        )
    meta = _read_meta(directory)
    chosen = _choose_max_seq_len(max_seq_len, meta, _config_value(directory, "max_position_embeddings"))
    _, encoder, ids = _exported_tokenizer(directory, chosen, "model", options)
    if meta is not None and meta.version:
        version = meta.version
    else:
        version = weights_version(directory) if find_weights(directory) is not None else "unversioned"
    log.warning(
        "backend=identity: NO INFERENCE; results name the model %r and their labels mean nothing",
        IDENTITY_MODEL_NAME,
    )
    return IdentityClassifier(
        encoder=encoder,
        pad_id=ids.pad,
        source_name=meta.name if meta is not None else directory.resolve().name,
        source_version=version,
        labels=meta.labels if meta is not None else list(DEFAULT_LABELS),
        max_seq_len=chosen,
        device=device,
        options=OnnxOptions(
            cpu_threads=options.cpu_threads or os.cpu_count() or 1,
            threads_per_call=options.cpu_threads_per_call,
        ),
    )


def _exported_parts(
    directory: Path, max_seq_len: int | None, graph: Path, kind: str, options: InferenceOptions
) -> ExportedParts:
    """Tokenizer and layout, max_seq_len, name, version (sentiment_model.json's, else the graph's hash) and
    labels. The fast tokenizer the export saved after its parity check serves `tokenizer=auto|fast` without
    importing PaddleNLP (seconds of every replica's start-up, and its memory); `slow`, an export without it,
    or another `tokenizers` version load PaddleNLP's ErnieTokenizer and check parity now, as before."""
    meta = _read_meta(directory)
    chosen = _choose_max_seq_len(max_seq_len, meta, _config_value(directory, "max_position_embeddings"))
    tokenizer, encoder, ids = _exported_tokenizer(directory, chosen, kind, options)
    return ExportedParts(
        tokenizer=tokenizer,
        encoder=encoder,
        pad_id=ids.pad,
        max_seq_len=chosen,
        name=meta.name if meta is not None else directory.resolve().name,
        version=meta.version if meta is not None and meta.version else _short_hash(graph),
        labels=meta.labels if meta is not None else list(DEFAULT_LABELS),
    )


def _exported_tokenizer(
    directory: Path, max_seq_len: int, kind: str, options: InferenceOptions
) -> tuple[Any, SequenceEncoder, SpecialIds]:
    """(PaddleNLP's tokenizer or None, the layout, the special ids) of an exported directory: the fast
    tokenizer its export checked and saved when `options.tokenizer` allows it and `tokenizers` is the version
    it was checked with, else PaddleNLP's ErnieTokenizer (and the parity check of `tokenizer=auto`)."""
    if options.tokenizer != "slow":
        try:
            saved = load_checked_fast_tokenizer(directory, _metadata_section(directory, "tokenizer"))
        except ValueError as exc:  # the message names the directory and says to re-export
            raise ModelLoadError(str(exc)) from exc
        if saved is not None:
            content, ids = saved
            return None, _layout(content, ids, max_seq_len, options), ids
        log.info(
            "%s has no fast tokenizer checked under this tokenizers version: loading PaddleNLP's "
            "ErnieTokenizer to check one now (seconds); re-export the model (`export`, then `quantize`; "
            "`make model` does it for the directories it derives) to start without it",
            directory,
        )
    from paddlenlp.transformers import ErnieTokenizer

    try:
        tokenizer = ErnieTokenizer.from_pretrained(str(directory))
    except Exception as exc:  # noqa: BLE001 - PaddleNLP raises many types; report them all the same way
        raise ModelLoadError(
            f"could not load the tokenizer from the {kind} directory {directory}: {exc}; re-run the export"
        ) from exc
    return tokenizer, _encoder(tokenizer, max_seq_len, options), SpecialIds.of(tokenizer)


def _metadata_section(directory: Path, key: str) -> dict[str, Any]:
    """A section of sentiment_model.json beyond ModelMetadata's fields (``export``, ``onnx``); {} if none."""
    path = directory / METADATA_FILE
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get(key) if path.is_file() else None
    except (ValueError, UnicodeDecodeError, AttributeError):
        return {}
    return dict(value) if isinstance(value, dict) else {}


def _read_meta(directory: Path, *, made_by: str = "export") -> ModelMetadata | None:
    """The directory's metadata file, None without one; an invalid one names ``made_by`` to re-run."""
    path = directory / METADATA_FILE
    if not path.is_file():
        return None
    try:
        return ModelMetadata.read(path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is invalid ({exc}); fix or delete it, or re-run {made_by}") from exc


def _choose_max_seq_len(requested: int | None, meta: ModelMetadata | None, limit: int | None) -> int:
    """The requested length, else the model's recorded one, else 128; capped at ``limit`` (the position
    embeddings) unless it was requested explicitly, which is then an error."""
    chosen = requested if requested is not None else (meta.max_seq_len if meta else HUB_DEFAULT_MAX_SEQ_LEN)
    if limit is not None and chosen > limit:
        if requested is not None:
            raise ModelLoadError(f"max_seq_len={requested} exceeds the model's {limit} position embeddings")
        chosen = limit
    return chosen


def _config_value(directory: Path, key: str) -> int | None:
    for name in CONFIG_FILES:
        path = directory / name
        if path.is_file():
            try:
                value = json.loads(path.read_text(encoding="utf-8")).get(key)
            except (ValueError, UnicodeDecodeError, AttributeError) as exc:
                raise ModelLoadError(f"{path} is not a valid JSON object ({exc}); re-run export") from exc
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(
                    f"{path}: {key!r} must be a positive integer, not {json.dumps(value)[:40]}; re-run export"
                )
            return value
    return None


def _short_hash(path: Path, length: int = 12) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:length]
