"""The tuner's shared vocabulary: its error, its modes and the JSON-able result it caches."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from worker.errors import OperationError

MIB = 1024 * 1024

TuningMode = Literal["gpu-memory", "cpu-throughput"]


class TuningError(OperationError):
    """Calibration cannot produce a budget; the message says why and what to change."""


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
