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

import argparse
import hashlib
import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from worker.config import WorkerSettings
from worker.inference import Classifier, is_out_of_memory

log = logging.getLogger(__name__)

MIB = 1024 * 1024
DEFAULT_CACHE_DIR = Path("~/.cache/sentiment-worker/tuning")
MEMORY_SEQ_LENS = (32, 64, 128, 256)
THROUGHPUT_SEQ_LENS = (32, 64, 128)
THROUGHPUT_BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
CACHE_FORMAT = 1

TuningMode = Literal["gpu-memory", "cpu-throughput"]


class TuningError(RuntimeError):
    """Calibration cannot produce a budget; the message says why and what to change."""


# ----- probes -----
class MemoryProbe(Protocol):
    """Measures the device memory the real model needs for one batch shape."""

    def peak_bytes(self, batch_size: int, seq_len: int) -> int:
        """Peak allocated device bytes while running a [batch_size, seq_len] batch (stats reset first).

        Raises the framework's out-of-memory error when the batch does not fit.
        """
        ...

    def device_total_bytes(self) -> int:
        """The device's total memory in bytes."""
        ...


class ThroughputProbe(Protocol):
    """Times the real model on one batch shape."""

    def batch_seconds(self, batch_size: int, seq_len: int) -> float:
        """Seconds of one inference call on a [batch_size, seq_len] batch (warm)."""
        ...


def synthetic_batch(classifier: Classifier, batch_size: int, seq_len: int) -> list[list[int]]:
    """`batch_size` copies of a real-token sequence of exactly `seq_len` ids ([CLS] … [SEP])."""
    if seq_len < 3:
        raise ValueError(f"seq_len must be at least 3, got {seq_len}")
    empty = classifier.token_ids([""])[0]
    cls_id, sep_id = empty[0], empty[-1]
    word = classifier.token_ids(["好"])[0]
    filler = word[1] if len(word) == 3 else sep_id
    row = [cls_id, *([filler] * (seq_len - 2)), sep_id]
    return [row] * batch_size


class PaddleCudaMemoryProbe:
    """The real GPU probe: Paddle's CUDA allocator statistics around one `predict_ids` call."""

    def __init__(self, classifier: Classifier, device_index: int = 0) -> None:
        self._classifier = classifier
        self._index = device_index

    def peak_bytes(self, batch_size: int, seq_len: int) -> int:
        import paddle

        cuda = paddle.device.cuda
        batch = synthetic_batch(self._classifier, batch_size, seq_len)
        cuda.synchronize(self._index)
        cuda.empty_cache()
        cuda.reset_max_memory_allocated(self._index)
        try:
            self._classifier.predict_ids(batch)
            cuda.synchronize(self._index)
        except Exception:
            cuda.empty_cache()  # give back what the failed attempt cached before the next probe
            raise
        return int(cuda.max_memory_allocated(self._index))

    def device_total_bytes(self) -> int:
        import paddle

        return int(paddle.device.cuda.get_device_properties(self._index).total_memory)


class ClassifierThroughputProbe:
    """The real CPU probe: best of `repeats` timed `predict_ids` calls after one warm-up call."""

    def __init__(
        self, classifier: Classifier, *, repeats: int = 2, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._classifier = classifier
        self._repeats = max(1, repeats)
        self._clock = clock

    def batch_seconds(self, batch_size: int, seq_len: int) -> float:
        batch = synthetic_batch(self._classifier, batch_size, seq_len)
        self._classifier.predict_ids(batch)
        best = math.inf
        for _ in range(self._repeats):
            started = self._clock()
            self._classifier.predict_ids(batch)
            best = min(best, self._clock() - started)
        return best


# ----- the memory model -----
@dataclass(frozen=True)
class MemoryProbeResult:
    """One probe: a batch shape and its peak allocated bytes (None when it ran out of memory)."""

    batch_size: int
    seq_len: int
    peak_bytes: int | None

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def out_of_memory(self) -> bool:
        return self.peak_bytes is None


@dataclass(frozen=True)
class MemoryFit:
    """peak bytes ≈ base + per_token·(batch·len) + per_token_position·(batch·len²)."""

    base_bytes: float
    per_token_bytes: float
    per_token_position_bytes: float
    rms_error_bytes: float
    points: int

    def predict(self, batch_size: int, seq_len: int) -> float:
        tokens = batch_size * seq_len
        return self.base_bytes + tokens * (self.per_token_bytes + self.per_token_position_bytes * seq_len)

    def max_tokens(self, seq_len: int, limit_bytes: float) -> int:
        """Largest padded-token count whose predicted peak at `seq_len` stays within `limit_bytes`."""
        slope = self.per_token_bytes + self.per_token_position_bytes * seq_len
        room = limit_bytes - self.base_bytes
        if room <= 0:
            return 0
        if slope <= 0:
            return 2**62
        return int(room // slope)


def fit_memory(probes: Sequence[MemoryProbeResult]) -> MemoryFit:
    """Least-squares fit of peak bytes on (1, batch·len, batch·len²) over the probes that fitted in memory.

    Coefficients of the token terms are kept non-negative (a negative one is dropped and the rest refit).
    """
    ok = [p for p in probes if p.peak_bytes is not None]
    if len(ok) < 3:
        raise TuningError(f"need at least 3 successful memory probes to fit, got {len(ok)}")
    tokens = np.array([p.tokens for p in ok], dtype=np.float64)
    lens = np.array([p.seq_len for p in ok], dtype=np.float64)
    peaks = np.array([p.peak_bytes for p in ok], dtype=np.float64)
    columns = {"b": tokens, "c": tokens * lens}
    for keep in (("b", "c"), ("b",), ("c",)):
        design = np.column_stack([np.ones_like(tokens), *(columns[k] for k in keep)])
        coef, *_ = np.linalg.lstsq(design, peaks, rcond=None)
        if all(value >= 0 for value in coef[1:]):
            break
    values = dict(zip(keep, coef[1:], strict=True))
    residuals = peaks - design @ coef
    return MemoryFit(
        base_bytes=float(coef[0]),
        per_token_bytes=float(values.get("b", 0.0)),
        per_token_position_bytes=float(values.get("c", 0.0)),
        rms_error_bytes=float(np.sqrt(np.mean(residuals**2))),
        points=len(ok),
    )


@dataclass(frozen=True)
class MemoryBudget:
    """The device's memory, the part inference may use, and that part less the safety margin (bytes)."""

    total_bytes: int
    budget_bytes: int
    limit_bytes: int
    source: str


def resolve_budget(
    total_bytes: int, *, budget_mb: int | None, fraction: float | None, margin: float
) -> MemoryBudget:
    """The usable bytes: `budget_mb` MiB or `fraction` of the device (at most the device), less `margin`."""
    if budget_mb is not None and fraction is not None:
        raise ValueError("set vram_budget_mb or vram_budget_fraction, not both")
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"vram_budget_fraction must be in (0, 1], got {fraction}")
    if not 0 <= margin < 1:
        raise ValueError(f"vram_safety_margin must be in [0, 1), got {margin}")
    if budget_mb is not None:
        budget = budget_mb * MIB
        source = f"vram_budget_mb={budget_mb}"
        if budget > total_bytes:
            source += f" (capped at the device's {total_bytes // MIB} MiB)"
            budget = total_bytes
    elif fraction is not None:
        budget, source = int(total_bytes * fraction), f"vram_budget_fraction={fraction:g}"
    else:
        budget, source = total_bytes, "the whole device (no vram_budget_mb / vram_budget_fraction set)"
    return MemoryBudget(total_bytes, budget, int(budget * (1 - margin)), source)


# ----- results -----
@dataclass
class TuningResult:
    """A calibrated token budget with what it was measured from (JSON-able)."""

    mode: TuningMode
    max_batch_tokens: int
    key: dict[str, str]
    details: dict[str, Any]
    probes: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    created_at: str = ""
    seconds: float = 0.0
    from_cache: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("from_cache")
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuningResult:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "from_cache"})


def search_memory_budget(
    probe: MemoryProbe,
    *,
    max_seq_len: int,
    budget_mb: int | None = None,
    fraction: float | None = None,
    margin: float = 0.1,
    seq_lens: Sequence[int] = MEMORY_SEQ_LENS,
    start_tokens: int = 256,
    max_tokens: int = 1 << 20,
    refine_steps: int = 3,
    verify_attempts: int = 6,
    progress: Callable[[str], None] | None = None,
) -> tuple[int, dict[str, Any], list[MemoryProbeResult], list[str]]:
    """The largest padded-token budget that fits the VRAM budget: (tokens, details, probes, notes).

    At each sequence length (those of `seq_lens` up to `max_seq_len`, plus `max_seq_len`) the padded token
    count doubles from `start_tokens` until a probe exceeds the limit, runs out of memory (then
    `refine_steps` bisection probes narrow down where) or passes `max_tokens`. If the device ran out of
    memory at all, the limit becomes `margin` below the largest peak that fitted (the device has less free
    memory than its size). The fit gives the budget for the worst case (all sequences at `max_seq_len`),
    capped at `max_tokens`; real probes verify it, bisecting towards the largest size known to fit.
    """
    say = progress or (lambda _line: None)
    budget = resolve_budget(probe.device_total_bytes(), budget_mb=budget_mb, fraction=fraction, margin=margin)
    lens = sorted({n for n in seq_lens if n <= max_seq_len} | {max_seq_len})
    probes: list[MemoryProbeResult] = []
    for seq_len in lens:
        probes += _probe_length(
            probe, seq_len, start_tokens, max_tokens, budget.limit_bytes, refine_steps, say
        )
    worst = lens[-1]
    first_worst = next(p for p in probes if p.seq_len == worst)
    if first_worst.batch_size == 1 and not _fits(first_worst, budget.limit_bytes):
        raise TuningError(
            f"one sequence of {worst} tokens does not fit in {budget.limit_bytes // MIB} MiB "
            f"({budget.source}, margin {margin:.0%}): raise the budget or lower max_seq_len"
        )
    fit = fit_memory(probes)
    notes: list[str] = []
    limit = budget.limit_bytes
    if any(p.out_of_memory for p in probes):
        usable = max(p.peak_bytes for p in probes if p.peak_bytes is not None)
        if int(usable * (1 - margin)) < limit:
            limit = int(usable * (1 - margin))
            notes.append(
                "the device ran out of memory below the budget (other processes on it?): "
                f"{usable / MIB:.0f} MiB was the largest peak that fitted; the limit is {margin:.0%} "
                f"below it, {limit / MIB:.0f} MiB"
            )
    tokens = fit.max_tokens(worst, limit)
    if tokens > max_tokens:
        notes.append(f"the fit allows {tokens} tokens; capped at {max_tokens} (the largest probed size)")
        tokens = max_tokens
    tokens, verified = _verify(probe, tokens, worst, limit, probes, verify_attempts, notes, say)
    details = {
        "budget": asdict(budget),
        "margin": margin,
        "limit_bytes": limit,
        "worst_case_seq_len": worst,
        "fit": asdict(fit),
        "verified": {"batch_size": verified.batch_size, "seq_len": worst, "peak_bytes": verified.peak_bytes},
    }
    return tokens, details, probes, notes


def _probe_length(
    probe: MemoryProbe,
    seq_len: int,
    start_tokens: int,
    max_tokens: int,
    limit_bytes: int,
    refine_steps: int,
    say: Callable[[str], None],
) -> list[MemoryProbeResult]:
    """Doubling probes at one length; after an out-of-memory, bisection probes between it and the last fit."""
    out: list[MemoryProbeResult] = []

    def measure(batch: int) -> MemoryProbeResult:
        result = _measure(probe, batch, seq_len)
        out.append(result)
        say(_describe_probe(result, limit_bytes))
        return result

    batch, last_ok = max(1, start_tokens // seq_len), 0
    while True:
        result = measure(batch)
        if result.out_of_memory:
            low, high = last_ok, batch
            for _ in range(refine_steps if low else 0):
                middle = (low + high) // 2
                if middle <= low:
                    break
                low, high = (low, middle) if measure(middle).out_of_memory else (middle, high)
            return out
        if not _fits(result, limit_bytes) or 2 * batch * seq_len > max_tokens:
            return out
        last_ok, batch = batch, batch * 2


def _verify(
    probe: MemoryProbe,
    tokens: int,
    worst: int,
    limit_bytes: int,
    probes: list[MemoryProbeResult],
    attempts: int,
    notes: list[str],
    say: Callable[[str], None],
) -> tuple[int, MemoryProbeResult]:
    """A budget confirmed by a real probe at the worst-case length: `tokens`, or bisected below it."""
    at_worst = [p for p in probes if p.seq_len == worst]
    good = max((p for p in at_worst if _fits(p, limit_bytes)), key=lambda p: p.tokens, default=None)
    bad_tokens = min((p.tokens for p in at_worst if not _fits(p, limit_bytes)), default=None)
    if bad_tokens is not None and tokens >= bad_tokens:
        tokens = ((good.tokens if good else 0) + bad_tokens) // 2
    for _ in range(attempts):
        if tokens < worst:
            break
        if good is not None and (tokens // worst) * worst <= good.tokens:
            return tokens, good  # already measured: a batch this size fits
        check = _measure(probe, tokens // worst, worst)
        probes.append(check)
        say("verify " + _describe_probe(check, limit_bytes))
        if _fits(check, limit_bytes):
            return tokens, check
        notes.append(f"verification at {check.tokens} tokens did not fit; bisecting below it")
        tokens = ((good.tokens if good else 0) + check.tokens) // 2
    if good is not None:
        notes.append(f"using {good.tokens} tokens, the largest worst-case size measured to fit")
        return good.tokens, good
    raise TuningError(
        f"no padded-token budget of at least one sequence of max_seq_len={worst} was verified to fit in "
        f"{limit_bytes // MIB} MiB: raise the VRAM budget or lower max_seq_len"
    )


def _fits(result: MemoryProbeResult, limit_bytes: int) -> bool:
    return result.peak_bytes is not None and result.peak_bytes <= limit_bytes


def _measure(probe: MemoryProbe, batch_size: int, seq_len: int) -> MemoryProbeResult:
    try:
        return MemoryProbeResult(batch_size, seq_len, int(probe.peak_bytes(batch_size, seq_len)))
    except Exception as exc:
        if is_out_of_memory(exc):
            return MemoryProbeResult(batch_size, seq_len, None)
        raise


def _describe_probe(result: MemoryProbeResult, limit_bytes: int) -> str:
    peak = "out of memory" if result.peak_bytes is None else f"{result.peak_bytes / MIB:.1f} MiB"
    return (
        f"probe batch {result.batch_size} x {result.seq_len} = {result.tokens} tokens: {peak} "
        f"(limit {limit_bytes / MIB:.1f} MiB)"
    )


@dataclass(frozen=True)
class ThroughputRow:
    """Throughput at one token budget, over the probed sequence lengths."""

    max_batch_tokens: int
    tokens_per_second: float
    worst_batch_seconds: float
    within_latency_bound: bool


def search_throughput_budget(
    probe: ThroughputProbe,
    *,
    max_seq_len: int,
    latency_bound_s: float = 1.0,
    tolerance: float = 0.03,
    seq_lens: Sequence[int] = THROUGHPUT_SEQ_LENS,
    budgets: Sequence[int] = THROUGHPUT_BUDGETS,
    patience: int = 2,
    progress: Callable[[str], None] | None = None,
) -> tuple[int, dict[str, Any], list[dict[str, Any]], list[str]]:
    """The CPU token budget: the smallest one within `tolerance` of the best tokens/s among budgets whose
    batches (worst: every sequence at `max_seq_len`) take at most `latency_bound_s`.

    Budgets are tried in ascending order; the search stops at the first budget over the latency bound or
    after `patience` budgets without a gain of more than `tolerance`. Returns (tokens, details, rows, notes).
    """
    say = progress or (lambda _line: None)
    lens = sorted({n for n in seq_lens if n <= max_seq_len} | {max_seq_len})
    candidates = sorted({b for b in budgets if b >= max_seq_len}) or [max_seq_len]
    rows: list[ThroughputRow] = []
    probes: list[dict[str, Any]] = []
    best, stale = 0.0, 0
    for budget in candidates:
        total_tokens, total_seconds, worst = 0, 0.0, 0.0
        for seq_len in lens:
            batch = max(1, budget // seq_len)
            seconds = float(probe.batch_seconds(batch, seq_len))
            probes.append(
                {"max_batch_tokens": budget, "batch_size": batch, "seq_len": seq_len, "seconds": seconds}
            )
            total_tokens += batch * seq_len
            total_seconds += seconds
            worst = max(worst, seconds)
        row = ThroughputRow(budget, total_tokens / total_seconds, worst, worst <= latency_bound_s)
        rows.append(row)
        say(
            f"budget {budget:>6} tokens: {row.tokens_per_second:,.0f} tokens/s, slowest batch "
            f"{worst * 1000:.0f} ms{'' if row.within_latency_bound else ' (over the latency bound)'}"
        )
        if not row.within_latency_bound:
            break
        if row.tokens_per_second > best * (1 + tolerance):
            best, stale = row.tokens_per_second, 0
        else:
            stale += 1
            if stale >= patience:
                break
    notes: list[str] = []
    feasible = [r for r in rows if r.within_latency_bound]
    if not feasible:
        chosen = rows[0]
        notes.append(
            f"even {chosen.max_batch_tokens} tokens take {chosen.worst_batch_seconds * 1000:.0f} ms "
            "per batch, "
            f"over the {latency_bound_s * 1000:.0f} ms bound; using the smallest budget"
        )
    else:
        top = max(r.tokens_per_second for r in feasible)
        chosen = next(r for r in feasible if r.tokens_per_second >= (1 - tolerance) * top)
    details = {
        "latency_bound_s": latency_bound_s,
        "tolerance": tolerance,
        "seq_lens": lens,
        "rows": [asdict(r) for r in rows],
        "chosen_tokens_per_second": chosen.tokens_per_second,
    }
    return chosen.max_batch_tokens, details, probes, notes


# ----- options, cache, entry point -----
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
    def from_settings(cls, settings: WorkerSettings, max_seq_len: int, **overrides: Any) -> TuneOptions:
        """Options from the settings; `overrides` whose value is None are ignored."""
        values: dict[str, Any] = {
            "max_seq_len": max_seq_len,
            "vram_budget_mb": settings.vram_budget_mb,
            "vram_budget_fraction": settings.vram_budget_fraction,
            "safety_margin": settings.vram_safety_margin,
            "latency_bound_s": settings.tuning_latency_bound_ms / 1000.0,
            "cache_dir": settings.tuning_cache_dir or DEFAULT_CACHE_DIR,
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
    settings: WorkerSettings, classifier: Classifier, *, progress: Callable[[str], None] | None = None
) -> TuningResult:
    """For start-up with `max_batch_tokens_auto`: the calibrated (usually cached) budget for `classifier`."""
    max_seq_len = int(getattr(classifier, "max_seq_len", settings.max_seq_len or 128))
    return tune(classifier, TuneOptions.from_settings(settings, max_seq_len), progress=progress)


# ----- report -----
def format_report(result: TuningResult) -> str:
    """A human-readable table of the probes, the fit and the chosen budget."""
    lines: list[str] = []
    k = result.key
    lines.append(
        f"model {k['model_name']} {k['model_version']} ({k['precision']}, {k['backend']}) "
        f"on {k['device_name']}, Paddle {k['paddle_version']}, max_seq_len {k['max_seq_len']}"
    )
    if result.mode == "gpu-memory":
        lines += ["", f"{'batch':>7} {'len':>5} {'tokens':>9} {'peak MiB':>10}"]
        for p in result.probes:
            peak = "OOM" if p["peak_bytes"] is None else f"{p['peak_bytes'] / MIB:.1f}"
            lines.append(f"{p['batch_size']:>7} {p['seq_len']:>5} {p['tokens']:>9} {peak:>10}")
        d, fit = result.details, result.details["fit"]
        budget = d["budget"]
        lines += [
            "",
            f"fit: peak ≈ {fit['base_bytes'] / MIB:.1f} MiB + {fit['per_token_bytes'] / 1024:.2f} "
            f"KiB·tokens + {fit['per_token_position_bytes']:.1f} B·tokens·len "
            f"(rms error {fit['rms_error_bytes'] / MIB:.2f} MiB, {fit['points']} points)",
            f"budget: {budget['budget_bytes'] / MIB:.0f} MiB of {budget['total_bytes'] / MIB:.0f} MiB "
            f"({budget['source']}), limit after the {d['margin']:.0%} margin "
            f"{d['limit_bytes'] / MIB:.0f} MiB",
            f"verified: {d['verified']['batch_size']} x {d['verified']['seq_len']} peaks at "
            f"{d['verified']['peak_bytes'] / MIB:.1f} MiB",
        ]
    else:
        lines += ["", f"{'budget':>8} {'tokens/s':>10} {'slowest batch ms':>17}"]
        for row in result.details["rows"]:
            mark = "" if row["within_latency_bound"] else "  over bound"
            lines.append(
                f"{row['max_batch_tokens']:>8} {row['tokens_per_second']:>10,.0f} "
                f"{row['worst_batch_seconds'] * 1000:>17.0f}{mark}"
            )
    lines += [f"note: {note}" for note in result.notes]
    what = "VRAM budget" if result.mode == "gpu-memory" else "CPU throughput (not memory)"
    source = "cached" if result.from_cache else f"measured in {result.seconds:.1f} s"
    lines.append(f"max_batch_tokens = {result.max_batch_tokens}  (tuned for {what}; {source})")
    return "\n".join(lines)


# ----- command -----
def cmd_tune(args: argparse.Namespace) -> int:
    from worker.cli import EXIT_OK, CommandError, _configure_logging, _load_model

    settings = args.settings_from_args(args)
    _configure_logging(settings.log_level if settings.log_level != "INFO" else "WARNING")
    classifier, _ = _load_model(settings.model, settings.device, settings.max_seq_len)
    try:
        options = TuneOptions.from_settings(
            settings,
            classifier.max_seq_len,
            vram_budget_mb=args.vram_budget_mb,
            vram_budget_fraction=args.vram_budget_fraction,
            safety_margin=args.safety_margin,
            latency_bound_s=None if args.latency_bound_ms is None else args.latency_bound_ms / 1000.0,
            cache_dir=args.cache_dir,
            use_cache=not args.force,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    kind, _ = device_description(classifier)
    print(
        "tuning for the VRAM budget (GPU)" if kind == "gpu" else "tuning for CPU throughput, not memory",
        flush=True,
    )
    try:
        result = tune(classifier, options, progress=lambda line: print("  " + line, flush=True))
    except TuningError as exc:
        raise CommandError(str(exc), 1) from None
    print(format_report(result), flush=True)
    print(f"cache: {cache_path(options.cache_dir, result.key)}")
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_json(), indent=2, ensure_ascii=False), encoding="utf-8")
    return EXIT_OK


def register(
    subparsers: Any,
    add_settings_flags: Callable[..., None],
    settings_from_args: Callable[[argparse.Namespace], WorkerSettings],
) -> None:
    """Adds `sentiment-worker tune`."""
    tune_parser = subparsers.add_parser(
        "tune", help="calibrate max_batch_tokens: to the VRAM budget on GPU, to throughput on CPU (cached)"
    )
    add_settings_flags(tune_parser, "model", "device")
    tune_parser.add_argument("--vram-budget-mb", type=int, default=None, help="GPU memory inference may use")
    tune_parser.add_argument("--vram-budget-fraction", type=float, default=None, help="share of the GPU")
    tune_parser.add_argument(
        "--safety-margin", type=float, default=None, help="share of the budget kept free"
    )
    tune_parser.add_argument("--latency-bound-ms", type=float, default=None, help="CPU: longest batch")
    tune_parser.add_argument("--cache-dir", type=Path, default=None, help=f"default {DEFAULT_CACHE_DIR}")
    tune_parser.add_argument("--force", action="store_true", help="measure again even if cached")
    tune_parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    tune_parser.set_defaults(func=cmd_tune, settings_from_args=settings_from_args)
