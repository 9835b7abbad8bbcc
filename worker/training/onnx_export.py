"""Export a trained model to ONNX (``sentiment-worker export --format onnx``).

The Paddle static export (worker.training.export, parity-checked against dygraph) converted by
``paddle2onnx``; the ONNX Runtime session is then checked against dygraph on the same probe texts and the
export fails when any probability differs by more than 1e-4. The output directory keeps the Paddle export
beside ``model.onnx``, so both the static and the onnx backend can serve it (and ``compare-backends
--record`` can let ``SENTIMENT_BACKEND=auto`` pick the faster one on this machine).
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from worker.model.device import choose_device
from worker.model.fast_tokenizer import PARITY_PROBES
from worker.model.loading import ModelLoadError
from worker.model.manifest import write_manifest
from worker.model.native_output import native_output_to_log
from worker.model.onnx_backend import ONNX_FILE
from worker.model.static_backend import PARAMS_FILE, graph_file
from worker.training.export import (
    PARITY_TOLERANCE,
    ExportError,
    corpus_probes,
    dygraph_parity,
    export_model,
    record_export,
    staged_directory,
)

OPSET_VERSION = 17
"""ONNX opset of the export: LayerNormalization is a standard op from 17 on."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnnxExportReport:
    """Where the export went, how long it took, and the parity of both exported forms with dygraph."""

    output_dir: Path
    onnx_file: Path
    seconds: float
    static_max_abs_diff: float
    onnx_max_abs_diff: float
    probe_texts: int


def convert_to_onnx(exported_dir: Path, onnx_file: Path) -> None:
    """``paddle2onnx`` of a Paddle static export into ``onnx_file`` (its console chatter suppressed)."""
    import paddle2onnx

    graph = graph_file(exported_dir)
    if graph is None:
        raise ExportError(f"{exported_dir} holds no Paddle static export to convert")
    chatter = io.StringIO()
    try:
        # Python-level prints into `chatter`, the C++ `[Paddle2ONNX]` lines to the log at DEBUG.
        with contextlib.redirect_stdout(chatter), native_output_to_log(log, "paddle2onnx"):
            paddle2onnx.export(
                str(graph),
                str(exported_dir / PARAMS_FILE),
                save_file=str(onnx_file),
                opset_version=OPSET_VERSION,
                enable_onnx_checker=True,
            )
    except Exception as exc:  # noqa: BLE001 - paddle2onnx raises plain Exceptions from C++
        raise ExportError(
            f"paddle2onnx could not convert {graph.name}: {type(exc).__name__}: {exc} "
            f"{chatter.getvalue()[-500:]}"
        ) from exc
    if not onnx_file.is_file():
        raise ExportError(f"paddle2onnx wrote no {onnx_file.name}: {chatter.getvalue()[-500:]}")


def export_onnx(
    source: Path,
    output_dir: Path,
    *,
    overwrite: bool = False,
    probe_texts: list[str] | None = None,
) -> OnnxExportReport:
    """Export the training directory ``source`` into ``output_dir`` as a Paddle static export plus
    ``model.onnx`` (float32). Written to a temporary sibling and renamed into place only after both
    parity checks pass. Raises ExportError."""
    import paddle2onnx

    started = time.perf_counter()
    source, output_dir = source.expanduser(), output_dir.expanduser()
    if output_dir.exists() and any(output_dir.iterdir()) and not overwrite:
        raise ExportError(
            f"{output_dir} exists and is not empty: choose another directory or pass --overwrite"
        )
    if source.is_dir() and output_dir.resolve() == source.resolve():
        raise ExportError("the output directory must differ from the source directory")
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with staged_directory(output_dir, "onnx.") as staging:
        probes = probe_texts or [*PARITY_PROBES, *corpus_probes()]
        static = export_model(source, staging, overwrite=True, probe_texts=probes)
        convert_to_onnx(staging, staging / ONNX_FILE)
        write_manifest(staging)  # the parity check loads it like any model directory
        try:
            diff, n = dygraph_parity(source, staging, choose_device("cpu"), probes, backend="onnx")
        except ModelLoadError as exc:
            raise ExportError(f"the ONNX model does not load: {exc}") from exc
        record_export(
            staging,
            {
                "precision": "float32",
                "file": ONNX_FILE,
                "opset": OPSET_VERSION,
                "paddle2onnx_version": paddle2onnx.__version__,
                "max_abs_diff_vs_dynamic": diff,
                "parity_probe_texts": n,
            },
            section="onnx",
        )
        if diff > PARITY_TOLERANCE:
            raise ExportError(
                f"ONNX Runtime and dynamic probabilities differ by {diff:.2e} (> {PARITY_TOLERANCE:g}) on "
                "probe texts; the ONNX export is not faithful — report this with the paddle2onnx version"
            )
    return OnnxExportReport(
        output_dir, output_dir / ONNX_FILE, time.perf_counter() - started, static.max_abs_diff, diff, n
    )
