"""Calibrating the inference token budget (`max_batch_tokens`): to a VRAM budget on GPU, to throughput on CPU.

GPU: run the real model on batches of increasing padded tokens at several sequence lengths, read the peak
allocated device memory of each (statistics reset between probes; an out-of-memory probe counts as over
budget), fit ``peak ≈ a + b·(batch·len) + c·(batch·len²)`` by least squares and pick the largest token budget
whose predicted peak for the worst case (every sequence at ``max_seq_len``) stays within
``budget·(1 − margin)``; one real probe at that size verifies it.

CPU there is no device memory to fit: the tuner measures tokens/s at increasing token budgets and picks the
smallest budget within a few percent of the best throughput whose batches stay under a latency bound.

Results are cached as JSON, keyed by model name and version, precision, backend, device name, Paddle
version and the tuning parameters, and reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from worker.config import BatchingSettings, ModelSettings
from worker.inference.classifier import Classifier
from worker.inference.tuning.memory_model import resolve_budget
from worker.inference.tuning.probes import (
    ClassifierThroughputProbe,
    MemoryProbe,
    PaddleCudaMemoryProbe,
    ThroughputProbe,
)
from worker.inference.tuning.result import TuningMode, TuningResult
from worker.inference.tuning.search import search_memory_budget, search_throughput_budget

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path("~/.cache/sentiment-worker/tuning")
CACHE_FORMAT = 1


@dataclass(frozen=True)
class TuneOptions:
    """What calibration needs from the settings (and the `tune` command's flags)."""

    max_seq_len: int
    vram_budget_mb: int | None = None
    vram_budget_fraction: float | None = None
    safety_margin: float = 0.1
    latency_bound_s: float = 1.0
    cache_dir: Path = DEFAULT_CACHE_DIR
    use_cache: bool = True

    def __post_init__(self) -> None:
        resolve_budget(
            1, budget_mb=self.vram_budget_mb, fraction=self.vram_budget_fraction, margin=self.safety_margin
        )
        if self.latency_bound_s <= 0:
            raise ValueError(f"the latency bound must be positive, got {self.latency_bound_s} s")

    @classmethod
    def from_settings(cls, batching: BatchingSettings, max_seq_len: int, **overrides: Any) -> TuneOptions:
        """Options from the settings; `overrides` whose value is None are ignored."""
        values: dict[str, Any] = {
            "max_seq_len": max_seq_len,
            "vram_budget_mb": batching.vram_budget_mb,
            "vram_budget_fraction": batching.vram_budget_fraction,
            "safety_margin": batching.vram_safety_margin,
            "latency_bound_s": batching.tuning_latency_bound_ms / 1000.0,
            "cache_dir": batching.tuning_cache_dir or DEFAULT_CACHE_DIR,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        # A budget given as a flag replaces the other kind of budget from the settings.
        if overrides.get("vram_budget_mb") is not None and overrides.get("vram_budget_fraction") is None:
            values["vram_budget_fraction"] = None
        if overrides.get("vram_budget_fraction") is not None and overrides.get("vram_budget_mb") is None:
            values["vram_budget_mb"] = None
        return cls(**values)


def tuning_key(
    classifier: Classifier,
    options: TuneOptions,
    *,
    mode: TuningMode,
    device_name: str,
    paddle_version: str,
) -> dict[str, str]:
    """What a cached result depends on: model, precision, backend, device, Paddle and the parameters."""
    key = {
        "model_name": str(getattr(classifier, "name", "unknown")),
        "model_version": str(getattr(classifier, "version", "unknown")),
        "precision": str(getattr(classifier, "precision", "float32")),
        "backend": str(getattr(classifier, "backend", "paddle-dygraph")),
        "device_name": device_name,
        "paddle_version": paddle_version,
        "mode": mode,
        "max_seq_len": str(options.max_seq_len),
    }
    if mode == "gpu-memory":
        key["vram_budget_mb"] = str(options.vram_budget_mb)
        key["vram_budget_fraction"] = str(options.vram_budget_fraction)
        key["safety_margin"] = str(options.safety_margin)
    else:
        key["latency_bound_s"] = str(options.latency_bound_s)
        key["parallel_calls"] = str(classifier.parallel_calls)  # calls side by side: another throughput
    return key


def cache_path(cache_dir: Path, key: dict[str, str]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir.expanduser() / f"{key['model_name']}-{digest}.json".replace("/", "_")


def load_cached(cache_dir: Path, key: dict[str, str]) -> TuningResult | None:
    """The cached result for exactly `key`, or None (missing, unreadable, or for another key)."""
    path = cache_path(cache_dir, key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or data.get("key") != key:
        return None
    try:
        result = TuningResult.from_json(data["result"])
    except (KeyError, TypeError):
        return None
    result.from_cache = True
    return result


def store_cached(cache_dir: Path, result: TuningResult) -> Path:
    """Writes `result` under its key (atomically: temp file, then rename); returns the path."""
    path = cache_path(cache_dir, result.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    payload = {"format": CACHE_FORMAT, "key": result.key, "result": result.to_json()}
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return path


def device_description(classifier: Classifier) -> tuple[Literal["gpu", "cpu"], str]:
    """(kind, name) of the classifier's device; CPU names carry the CPU model and thread count."""
    device = getattr(classifier, "device", None)
    kind = "gpu" if getattr(device, "kind", "cpu") == "gpu" else "cpu"
    if kind == "gpu":
        return "gpu", str(getattr(device, "name", "gpu"))
    return "cpu", f"cpu {_cpu_model()} x{os.cpu_count() or 1}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _paddle_version() -> str:
    import paddle

    return str(paddle.__version__)


def tune(
    classifier: Classifier,
    options: TuneOptions,
    *,
    memory_probe: MemoryProbe | None = None,
    throughput_probe: ThroughputProbe | None = None,
    device: tuple[Literal["gpu", "cpu"], str] | None = None,
    paddle_version: str | None = None,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> TuningResult:
    """The token budget for `classifier` on its device: from the cache when its key matches, else measured
    (GPU: to the VRAM budget; CPU: to throughput) and cached. Probes default to the real ones."""
    kind, name = device if device is not None else device_description(classifier)
    mode: TuningMode = "gpu-memory" if kind == "gpu" else "cpu-throughput"
    key = tuning_key(
        classifier, options, mode=mode, device_name=name, paddle_version=paddle_version or _paddle_version()
    )
    if options.use_cache:
        cached = load_cached(options.cache_dir, key)
        if cached is not None:
            log.info("token budget %d from the tuning cache", cached.max_batch_tokens)
            return cached
    started = clock()
    if mode == "gpu-memory":
        tokens, details, memory_probes, notes = search_memory_budget(
            memory_probe or PaddleCudaMemoryProbe(classifier),
            max_seq_len=options.max_seq_len,
            budget_mb=options.vram_budget_mb,
            fraction=options.vram_budget_fraction,
            margin=options.safety_margin,
            progress=progress,
        )
        probes = [{**asdict(p), "tokens": p.tokens} for p in memory_probes]
    else:
        tokens, details, probes, notes = search_throughput_budget(
            throughput_probe or ClassifierThroughputProbe(classifier),
            max_seq_len=options.max_seq_len,
            latency_bound_s=options.latency_bound_s,
            progress=progress,
        )
        notes.insert(0, "tuned for CPU throughput, not memory (there is no device memory to fit on CPU)")
    result = TuningResult(
        mode=mode,
        max_batch_tokens=tokens,
        key=key,
        details=details,
        probes=probes,
        notes=notes,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        seconds=round(clock() - started, 3),
    )
    try:  # a fresh measurement replaces the cached one (also with use_cache=False)
        store_cached(options.cache_dir, result)
    except OSError as exc:
        log.warning("could not cache the tuning result in %s: %s", options.cache_dir, exc)
    return result


def resolve_token_budget(
    batching: BatchingSettings,
    model: ModelSettings,
    classifier: Classifier,
    *,
    progress: Callable[[str], None] | None = None,
    memory_probe: MemoryProbe | None = None,
) -> TuningResult:
    """For start-up with `max_batch_tokens_auto` (or a GPU's default): the calibrated (usually cached)
    budget for `classifier`; `memory_probe` replaces the real device-memory probe."""
    max_seq_len = int(getattr(classifier, "max_seq_len", model.max_seq_len or 128))
    options = TuneOptions.from_settings(batching, max_seq_len)
    return tune(classifier, options, progress=progress, memory_probe=memory_probe)
