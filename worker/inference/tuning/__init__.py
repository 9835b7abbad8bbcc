"""Calibrating the inference token budget (`max_batch_tokens`): to a VRAM budget on GPU, to throughput on
CPU, cached. `calibration` is the entry point; `probes`, `memory_model` and `search` are its parts."""

from worker.inference.tuning.calibration import (
    DEFAULT_CACHE_DIR,
    TuneOptions,
    cache_path,
    device_description,
    resolve_token_budget,
    tune,
)
from worker.inference.tuning.result import MIB, TuningError, TuningMode, TuningResult

__all__ = [
    "DEFAULT_CACHE_DIR",
    "MIB",
    "TuneOptions",
    "TuningError",
    "TuningMode",
    "TuningResult",
    "cache_path",
    "device_description",
    "resolve_token_budget",
    "tune",
]
