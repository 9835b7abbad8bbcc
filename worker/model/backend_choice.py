"""Which backend serves a model directory under ``SENTIMENT_BACKEND=auto``: the one measured fastest on this
machine, when ``sentiment-worker compare-backends --record`` left a measurement in the directory and the
choice is safe; otherwise the rule by directory kind (static export → static, ONNX only → onnx, else
dynamic).

Safe means: the measurement was taken on this CPU model with this many cores, the backend it names can
serve this directory (its files are here), and that backend's held-out accuracy was within
``SAFE_ACCURACY_LOSS`` of the directory's best measured one — auto never trades accuracy for speed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

MEASUREMENT_FILE = "backend_measurement.json"
SAFE_ACCURACY_LOSS = 0.001
"""Largest held-out accuracy loss (fraction) auto accepts for speed: 0.1 point."""


def _cpuinfo_field(name: str, cpuinfo: str | None = None) -> str:
    """The first processor's ``name`` line of /proc/cpuinfo (``cpuinfo`` for tests); "" when absent."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


def cpu_identity() -> str:
    """``<model name> x<cores>`` of this machine (what a speed measurement is only valid on)."""
    return f"{_cpuinfo_field('model name') or 'unknown cpu'} x{os.cpu_count() or 1}"


CPU_FEATURES = (
    ("avx2", "AVX2"),
    ("fma", "FMA"),
    ("avx512f", "AVX-512"),
    ("avx512_vnni", "AVX-512 VNNI"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx512_bf16", "AVX-512 BF16"),
    ("amx_tile", "AMX"),
)
"""/proc/cpuinfo flags that decide which compressed form pays (INT8 dot products, bfloat16), in order."""


def cpu_features(cpuinfo: str | None = None) -> list[str]:
    """The `CPU_FEATURES` this CPU has (the first processor's flags; ``cpuinfo`` for tests)."""
    flags = set(_cpuinfo_field("flags", cpuinfo).split())
    return [name for flag, name in CPU_FEATURES if flag in flags]


def cpu_description() -> str:
    """``<model name> x<cores>: AVX2, FMA, ...``: the CPU a measurement ran on, with the features that
    decide INT8 and bfloat16."""
    features = ", ".join(cpu_features()) or "no AVX2, AVX-512, VNNI, BF16 or AMX"
    return f"{cpu_identity()}: {features}"


def compression_outlook(features: list[str]) -> str:
    """What the features mean for INT8 and bfloat16 here (machines of one kind differ: measure, then pick)."""
    if "AVX-512 VNNI" in features or "AVX-VNNI" in features:
        int8 = "INT8 dot products in hardware (VNNI)"
    elif "AVX2" in features:
        int8 = "INT8 through AVX2 (no VNNI: smaller INT8 gains)"
    else:
        int8 = "no AVX2: INT8 kernels unlikely to pay"
    if "AVX-512 BF16" in features or "AMX" in features:
        bf16 = "bfloat16 native (SENTIMENT_USE_BF16=true can pay)"
    else:
        bf16 = "no native bfloat16 (SENTIMENT_USE_BF16 is refused)"
    return f"{int8}; {bf16}"


@dataclass(frozen=True)
class BackendResult:
    """One backend's measurement on a directory: throughput (reviews/s, median of model-only passes) and
    held-out accuracy (fraction)."""

    texts_per_s: float
    accuracy: float


@dataclass(frozen=True)
class BackendMeasurement:
    """What ``compare-backends --record`` writes into a model directory."""

    cpu: str
    backends: dict[str, BackendResult]
    measured_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def fastest_safe(self, available: set[str]) -> str | None:
        """The fastest measured backend among ``available`` whose accuracy is within SAFE_ACCURACY_LOSS of
        the best measured accuracy among them; None when none was measured."""
        measured = {name: r for name, r in self.backends.items() if name in available}
        if not measured:
            return None
        best = max(r.accuracy for r in measured.values())
        safe = {name: r for name, r in measured.items() if best - r.accuracy <= SAFE_ACCURACY_LOSS}
        return max(safe, key=lambda name: safe[name].texts_per_s)

    def write(self, directory: Path) -> Path:
        """Write ``MEASUREMENT_FILE`` into ``directory``; returns its path."""
        path = directory / MEASUREMENT_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, directory: Path) -> BackendMeasurement | None:
        """The directory's measurement, or None when it has none or it is unreadable (then auto falls
        back to the rule by directory kind, never fails)."""
        path = directory / MEASUREMENT_FILE
        if not path.is_file():
            return None
        try:
            raw: Any = json.loads(path.read_text(encoding="utf-8"))
            backends = {
                str(name): BackendResult(float(r["texts_per_s"]), float(r["accuracy"]))
                for name, r in raw["backends"].items()
            }
            return cls(cpu=str(raw["cpu"]), backends=backends, measured_at=str(raw.get("measured_at", "")))
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            return None


def measured_choice(directory: Path, available: set[str]) -> tuple[str | None, str]:
    """(backend, why) from the directory's measurement; (None, why not) when there is no safe choice."""
    measurement = BackendMeasurement.read(directory)
    if measurement is None:
        return None, f"no readable {MEASUREMENT_FILE}"
    here = cpu_identity()
    if measurement.cpu != here:
        return None, f"{MEASUREMENT_FILE} was measured on {measurement.cpu!r}, this is {here!r}"
    choice = measurement.fastest_safe(available)
    if choice is None:
        return None, f"{MEASUREMENT_FILE} measured none of {sorted(available)}"
    rate = measurement.backends[choice].texts_per_s
    return (
        choice,
        f"fastest safe backend in {MEASUREMENT_FILE} ({rate:.1f} reviews/s, {measurement.measured_at})",
    )
