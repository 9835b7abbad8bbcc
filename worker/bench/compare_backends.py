"""`sentiment-worker compare-backends`: for each model × backend, held-out accuracy, its delta from float32,
model-only throughput at the demo's review-length mix, and peak RSS — one command, one run, medians.

Per training directory the served forms are made first (in ``work_dir``): the ONNX export (Paddle static
export + ``model.onnx``, both parity-checked against dygraph) and its INT8 quantizations. Each backend is
then measured in a fresh process (spawned), so its peak RSS is its own: load, held-out accuracy, then
``repeats`` timed passes of `bench`'s model-only phase (the worker's windows, batch size and token budget,
tokenization included) over the same shuffled corpus reviews; the median pass is reported.

Rows: dygraph (training directory), paddle-fp32 (Paddle Inference + oneDNN), paddle-bf16 (oneDNN bfloat16,
on CPUs with native bf16), paddle-int8 (not available with paddlepaddle 3.3.1: the row says why), ort-fp32,
and one ort-int8 row per quantization method.
``record`` writes the measurement of the two fp32 forms into the ONNX export directory, where
``SENTIMENT_BACKEND=auto`` reads it (worker.model.backend_choice).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import resource
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from worker.bench.bench import bench_model_only, review_texts
from worker.config import WorkerSettings
from worker.model.backend_choice import BackendMeasurement, BackendResult, cpu_identity
from worker.model.device import choose_device
from worker.model.loading import Backend, InferenceOptions, load_classifier
from worker.model.static_backend import cpu_has_bf16
from worker.training.evaluate import HELDOUT_FILE, predict_probs, read_heldout
from worker.training.onnx_export import export_onnx
from worker.training.quantize import METHODS, QuantMethod, quantize_model

PADDLE_INT8_UNAVAILABLE = (
    "unavailable with paddlepaddle 3.3.1: paddle.quantization PTQ models fail to export with dynamic "
    "shapes under PIR, and the legacy program export the oneDNN INT8 passes need fails for ERNIE "
    "(README, 'Compressed models')"
)
REFERENCE_BACKEND = "paddle-fp32"
"""The float32 form accuracy deltas are taken from (what the worker serves on CPU today)."""


@dataclass(frozen=True)
class TableOptions:
    """Sizes of one run. ``texts``: reviews per timed pass; ``heldout_limit`` None: the whole split."""

    texts: int = 1024
    repeats: int = 3
    heldout_limit: int | None = None
    methods: tuple[QuantMethod, ...] = ("ort-dynamic",)
    cpu_threads: int | None = None
    seed: int = 0


@dataclass(frozen=True)
class Job:
    """One (model, backend) measurement: which directory, served how."""

    model: str
    backend: str
    directory: str
    serve_as: Backend
    heldout: str
    use_bf16: bool = False


@dataclass
class Row:
    """One line of the table; ``status`` is ``ok`` or why the backend could not be measured."""

    model: str
    backend: str
    status: str
    accuracy: float | None = None
    delta_points: float | None = None
    msgs_per_s: float | None = None
    passes_msgs_per_s: list[float] = field(default_factory=list)
    peak_rss_mb: float | None = None
    precision: str = "float32"
    heldout_texts: int = 0


def measure_job(job: Job, options: TableOptions) -> Row:
    """Runs in a fresh process: load, held-out accuracy, ``repeats`` model-only passes, peak RSS."""
    defaults = WorkerSettings.model_fields
    classifier = load_classifier(
        job.directory,
        choose_device("cpu"),
        options=InferenceOptions(
            backend=job.serve_as, cpu_threads=options.cpu_threads, use_bf16=job.use_bf16
        ),
    )
    examples = read_heldout(Path(job.heldout))[: options.heldout_limit]
    probs, _ = predict_probs(classifier, [e.text for e in examples], 32)
    gold = np.array([e.label_id for e in examples], dtype=np.int64)
    texts = review_texts(options.texts, options.seed)
    passes = []
    for _ in range(max(1, options.repeats)):
        phase = bench_model_only(
            classifier,
            texts,
            window=int(defaults["max_window_messages"].default),
            max_batch_size=int(defaults["max_batch_size"].default),
            max_batch_tokens=int(defaults["max_batch_tokens"].default),
        )
        passes.append(phase.messages_per_second)
    return Row(
        model=job.model,
        backend=job.backend,
        status="ok",
        accuracy=float((probs.argmax(axis=1) == gold).mean()),
        msgs_per_s=statistics.median(passes),
        passes_msgs_per_s=passes,
        peak_rss_mb=peak_rss_mb(),
        precision=str(getattr(classifier, "precision", "float32")),
        heldout_texts=len(examples),
    )


def peak_rss_mb() -> float:
    """This process's peak resident set (MiB): VmHWM, which exec resets. (getrusage's ru_maxrss keeps the
    forking parent's peak across exec, so a spawned child would report the parent's.)"""
    try:
        for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def in_fresh_process(job: Job, options: TableOptions) -> Row:
    """``measure_job`` in a spawned process of its own (its peak RSS is then this backend's alone)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        try:
            return pool.submit(measure_job, job, options).result()
        except Exception as exc:  # noqa: BLE001 - a failing backend is a row that says why, not a crash
            return Row(job.model, job.backend, f"failed: {type(exc).__name__}: {exc}")


def prepare_forms(
    training_dir: Path, work_dir: Path, options: TableOptions, progress: Callable[[str], None]
) -> tuple[str, list[Job], list[Row]]:
    """Export and quantize ``training_dir`` into ``work_dir``; the jobs to measure and the rows that can't
    be measured (with why)."""
    name = training_dir.resolve().name
    heldout = training_dir / HELDOUT_FILE
    if not heldout.is_file():
        raise FileNotFoundError(
            f"{training_dir} has no {HELDOUT_FILE}: pass a `sentiment-worker train` directory"
        )
    onnx_dir = work_dir / f"{name}-onnx"
    progress(f"{name}: exporting to {onnx_dir} (Paddle static + ONNX, parity-checked)")
    export_onnx(training_dir, onnx_dir, overwrite=True)
    jobs = [
        Job(name, "dygraph", str(training_dir), "dynamic", str(heldout)),
        Job(name, "paddle-fp32", str(onnx_dir), "static", str(heldout)),
        Job(name, "ort-fp32", str(onnx_dir), "onnx", str(heldout)),
    ]
    unavailable = [Row(name, "paddle-int8", PADDLE_INT8_UNAVAILABLE, precision="int8")]
    if cpu_has_bf16():
        jobs.append(Job(name, "paddle-bf16", str(onnx_dir), "static", str(heldout), use_bf16=True))
    else:
        unavailable.append(
            Row(name, "paddle-bf16", "unavailable: no native bfloat16 on this CPU", precision="bfloat16")
        )
    for method in options.methods:
        int8_dir = work_dir / f"{name}-{method}"
        progress(f"{name}: quantizing ({method}) to {int8_dir}")
        quantize_model(
            onnx_dir,
            int8_dir,
            method=method,
            heldout=heldout,
            heldout_limit=options.heldout_limit,
            overwrite=True,
        )
        jobs.append(Job(name, f"ort-int8 ({method})", str(int8_dir), "onnx", str(heldout)))
    return name, jobs, unavailable


def compare_backends(
    models: Sequence[Path],
    *,
    work_dir: Path | None = None,
    options: TableOptions | None = None,
    record: bool = False,
    progress: Callable[[str], None] = lambda line: None,
) -> list[Row]:
    """The table for ``models`` (training directories). ``record``: write each ONNX export's fp32
    measurement for ``SENTIMENT_BACKEND=auto`` (needs a kept ``work_dir``)."""
    options = options or TableOptions()
    if record and work_dir is None:
        raise ValueError("record needs a work directory that is kept (the served forms live there)")
    unknown = set(options.methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown quantization methods {sorted(unknown)}: choose from {', '.join(METHODS)}")
    with tempfile.TemporaryDirectory(prefix="compare-backends-") as tmp:
        base = work_dir or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        rows: list[Row] = []
        for model in models:
            name, jobs, unavailable = prepare_forms(model.expanduser(), base, options, progress)
            measured = []
            for job in jobs:
                progress(
                    f"{name}: measuring {job.backend} ({options.repeats} passes of {options.texts} reviews)"
                )
                measured.append(in_fresh_process(job, options))
            model_rows = with_deltas([*measured, *unavailable])
            rows.extend(model_rows)
            if record:
                record_measurement(base / f"{name}-onnx", model_rows)
        return rows


def with_deltas(rows: list[Row]) -> list[Row]:
    """Rows in table order with ``delta_points`` (percentage points) from the REFERENCE_BACKEND's accuracy."""
    reference = next(
        (r.accuracy for r in rows if r.backend == REFERENCE_BACKEND and r.accuracy is not None), None
    )
    for row in rows:
        if row.accuracy is not None and reference is not None:
            row.delta_points = 100.0 * (row.accuracy - reference)
    order = ["dygraph", "paddle-fp32", "paddle-bf16", "paddle-int8", "ort-fp32"]
    return sorted(rows, key=lambda r: order.index(r.backend) if r.backend in order else len(order))


def record_measurement(onnx_dir: Path, rows: Sequence[Row]) -> Path | None:
    """Writes the fp32 forms served from ``onnx_dir`` (static, onnx) into its BackendMeasurement file."""
    served = {"paddle-fp32": "static", "ort-fp32": "onnx"}
    results = {
        served[r.backend]: BackendResult(texts_per_s=r.msgs_per_s, accuracy=r.accuracy)
        for r in rows
        if r.backend in served and r.msgs_per_s is not None and r.accuracy is not None
    }
    if not results:
        return None
    return BackendMeasurement(cpu=cpu_identity(), backends=results).write(onnx_dir)


def format_table(rows: Sequence[Row]) -> str:
    """The table for people: one line per model × backend."""
    header = (
        f"{'model':28} {'backend':24} {'accuracy':>9} {'Δ vs fp32':>10} {'msg/s (median)':>15} "
        f"{'vs paddle-fp32':>15} {'peak RSS':>10}"
    )
    lines = [header, "-" * len(header)]
    reference = {r.model: r.msgs_per_s for r in rows if r.backend == REFERENCE_BACKEND and r.msgs_per_s}
    for r in rows:
        if r.status != "ok":
            lines.append(f"{r.model:28} {r.backend:24} {r.status}")
            continue
        ratio = (
            f"{r.msgs_per_s / reference[r.model]:.2f}x" if r.msgs_per_s and reference.get(r.model) else "-"
        )
        delta = f"{r.delta_points:+.2f} pt" if r.delta_points is not None else "-"
        lines.append(
            f"{r.model:28} {r.backend:24} {r.accuracy:>9.2%} {delta:>10} {r.msgs_per_s:>15.1f} "
            f"{ratio:>15} {r.peak_rss_mb:>7.0f} MB"
        )
    return "\n".join(lines)


def rows_as_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """JSON-friendly rows."""
    return [asdict(r) for r in rows]
