"""The GPU memory model: peak ≈ a + b·(batch·len) + c·(batch·len²), fitted by least squares, and the
VRAM budget it is held against."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from worker.inference.tuning.result import MIB, TuningError


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
