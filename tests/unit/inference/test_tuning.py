"""Token-budget calibration: the memory search and fit, the CPU throughput search, budgets, the cache."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from worker.config import WorkerSettings
from worker.inference.tuning import MIB, TuneOptions, TuningError, TuningResult, cache_path, tune
from worker.inference.tuning.memory_model import MemoryProbeResult, fit_memory, resolve_budget
from worker.inference.tuning.probes import synthetic_batch
from worker.inference.tuning.search import search_memory_budget, search_throughput_budget
from worker.model.device import DeviceChoice

GIB = 1024 * MIB


class FakeMemoryProbe:
    """Peak bytes = base + per_token·(batch·len) + per_token_position·(batch·len²), like a transformer."""

    def __init__(
        self,
        *,
        base: float = 300 * MIB,
        per_token: float = 40 * 1024,
        per_token_position: float = 120.0,
        total: int = 8 * GIB,
    ) -> None:
        self.base, self.per_token, self.per_token_position, self.total = (
            base,
            per_token,
            per_token_position,
            total,
        )
        self.calls: list[tuple[int, int]] = []

    def true_peak(self, batch_size: int, seq_len: int) -> float:
        tokens = batch_size * seq_len
        return self.base + self.per_token * tokens + self.per_token_position * tokens * seq_len

    def peak_bytes(self, batch_size: int, seq_len: int) -> int:
        self.calls.append((batch_size, seq_len))
        return int(self.true_peak(batch_size, seq_len))

    def device_total_bytes(self) -> int:
        return self.total


class FakeProbeThatOOMsPastThreshold(FakeMemoryProbe):
    """Says the device has `total` bytes, but raises out-of-memory past `threshold` (other tenants)."""

    def __init__(self, threshold: int, **kwargs: float) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.threshold = threshold
        self.oom_calls = 0

    def peak_bytes(self, batch_size: int, seq_len: int) -> int:
        if self.true_peak(batch_size, seq_len) > self.threshold:
            self.calls.append((batch_size, seq_len))
            self.oom_calls += 1
            raise MemoryError(
                f"ResourceExhaustedError: Out of memory error on GPU 0 ({batch_size}x{seq_len})"
            )
        return super().peak_bytes(batch_size, seq_len)


class FakeProbeWithAllocatorStep(FakeMemoryProbe):
    """Like FakeMemoryProbe, plus a step of `step` bytes past `from_tokens` tokens that the fit can't see."""

    def __init__(self, from_tokens: int, step: float, **kwargs: float) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.from_tokens, self.step = from_tokens, step

    def true_peak(self, batch_size: int, seq_len: int) -> float:
        extra = self.step if batch_size * seq_len > self.from_tokens else 0.0
        return super().true_peak(batch_size, seq_len) + extra


class FakeThroughputProbe:
    """Seconds = overhead + tokens / rate, with attention cost growing with length; saturates at `rate`."""

    def __init__(
        self,
        *,
        overhead_s: float = 0.01,
        rate: float = 20_000.0,
        slow_past_tokens: int | None = None,
        parallel_calls: int = 1,
    ):
        self.overhead_s, self.rate, self.slow_past_tokens = overhead_s, rate, slow_past_tokens
        self.parallel_calls = parallel_calls
        self.calls: list[tuple[int, int]] = []

    def batch_seconds(self, batch_size: int, seq_len: int) -> float:
        self.calls.append((batch_size, seq_len))
        tokens = batch_size * seq_len
        seconds = self.overhead_s + tokens / self.rate * (1 + seq_len / 512)
        if self.slow_past_tokens is not None and tokens > self.slow_past_tokens:
            seconds *= 1.5  # past the cache: slower per token
        return seconds


@dataclass
class FakeClassifier:
    """Just what tuning reads of a classifier: identity, max_seq_len, and token ids for probe batches."""

    name: str = "fake-model"
    version: str = "v1"
    max_seq_len: int = 128
    labels: Sequence[str] = ("negative", "positive")
    call_overhead_tokens = None  # fewest batches
    parallel_calls = 1  # one call at a time

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [[1, *(100 + ord(c) % 50 for c in text), 2] for text in texts]

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        return np.full((len(batch), 2), 0.5, dtype=np.float32)


# ----- fit and memory search -----
def test_fit_recovers_the_coefficients_of_a_linear_plus_quadratic_memory_model() -> None:
    probe = FakeMemoryProbe()
    probes = [
        MemoryProbeResult(b, n, probe.peak_bytes(b, n)) for n in (32, 64, 128, 256) for b in (1, 4, 16, 64)
    ]
    fit = fit_memory(probes)
    assert fit.base_bytes == pytest.approx(probe.base, rel=1e-6)
    assert fit.per_token_bytes == pytest.approx(probe.per_token, rel=1e-6)
    assert fit.per_token_position_bytes == pytest.approx(probe.per_token_position, rel=1e-6)
    assert fit.points == 16


def test_fit_ignores_out_of_memory_probes_and_needs_three_points() -> None:
    ok = [MemoryProbeResult(1, 32, 1000), MemoryProbeResult(2, 32, 1100)]
    with pytest.raises(TuningError, match="at least 3"):
        fit_memory([*ok, MemoryProbeResult(4, 32, None)])


def test_memory_search_picks_the_largest_budget_that_fits_the_limit() -> None:
    probe = FakeMemoryProbe()
    tokens, details, probes, _ = search_memory_budget(probe, max_seq_len=256, budget_mb=4096, margin=0.1)
    limit = 4096 * MIB * 0.9
    assert details["budget"]["limit_bytes"] == int(limit)
    worst = details["worst_case_seq_len"]
    assert worst == 256
    # Every batch the batcher can form within the budget fits: the worst case is all sequences at 256.
    assert probe.true_peak(tokens // worst, worst) <= limit
    for seq_len in (16, 32, 100, 256):
        assert probe.true_peak(tokens // seq_len, seq_len) <= limit
    # ...and it is the largest such budget (one more token would not fit the worst case).
    slope = probe.per_token + probe.per_token_position * worst
    assert probe.base + (tokens + 1) * slope > limit
    # Probes at every length 32..256, the last one being the verification at the chosen size.
    assert {p.seq_len for p in probes} == {32, 64, 128, 256}
    assert probes[-1].tokens == tokens // worst * worst
    assert details["verified"]["peak_bytes"] <= limit


def test_memory_search_stays_below_the_point_where_the_device_runs_out_of_memory() -> None:
    threshold = 3 * GIB
    probe = FakeProbeThatOOMsPastThreshold(threshold)  # the device claims 8 GiB
    tokens, details, probes, _ = search_memory_budget(probe, max_seq_len=256, margin=0.1)
    assert probe.oom_calls > 0, "the search probed past the real limit"
    assert sum(p.out_of_memory for p in probes) == probe.oom_calls
    assert probe.true_peak(tokens // 256, 256) <= threshold
    assert details["verified"]["peak_bytes"] <= threshold
    assert tokens >= 256


def test_verification_shrinks_the_budget_when_the_real_peak_is_above_the_fit() -> None:
    # A 600 MiB allocator step past 20k tokens: the probes below it can't predict it.
    probe = FakeProbeWithAllocatorStep(from_tokens=20_000, step=600 * MIB)
    tokens, details, _, notes = search_memory_budget(
        probe, max_seq_len=128, budget_mb=2048, margin=0.0, seq_lens=(32, 64), max_tokens=16_384
    )
    assert probe.true_peak(tokens // 128, 128) <= 2048 * MIB
    assert details["verified"]["peak_bytes"] <= 2048 * MIB


def test_fraction_and_margin_set_the_limit() -> None:
    probe = FakeMemoryProbe(total=10 * GIB)
    tokens, details, _, _ = search_memory_budget(probe, max_seq_len=128, fraction=0.5, margin=0.2)
    assert details["budget"]["budget_bytes"] == 5 * GIB
    assert details["budget"]["limit_bytes"] == 4 * GIB
    assert probe.true_peak(tokens // 128, 128) <= 4 * GIB
    bigger, _, _, _ = search_memory_budget(
        FakeMemoryProbe(total=10 * GIB), max_seq_len=128, fraction=0.5, margin=0.0
    )
    assert bigger > tokens


def test_resolve_budget_rules() -> None:
    assert resolve_budget(8 * GIB, budget_mb=None, fraction=None, margin=0.1).limit_bytes == int(
        8 * GIB * 0.9
    )
    capped = resolve_budget(8 * GIB, budget_mb=100_000, fraction=None, margin=0.0)
    assert capped.budget_bytes == 8 * GIB and "capped" in capped.source
    assert resolve_budget(8 * GIB, budget_mb=1024, fraction=None, margin=0.5).limit_bytes == 512 * MIB
    with pytest.raises(ValueError, match="not both"):
        resolve_budget(8 * GIB, budget_mb=1024, fraction=0.5, margin=0.1)
    for fraction in (0.0, 1.5):
        with pytest.raises(ValueError, match="vram_budget_fraction"):
            resolve_budget(8 * GIB, budget_mb=None, fraction=fraction, margin=0.1)
    with pytest.raises(ValueError, match="vram_safety_margin"):
        resolve_budget(8 * GIB, budget_mb=None, fraction=None, margin=1.0)


def test_a_budget_too_small_for_one_longest_sequence_is_refused() -> None:
    probe = FakeMemoryProbe(base=500 * MIB)
    with pytest.raises(TuningError, match="lower max_seq_len"):
        search_memory_budget(probe, max_seq_len=256, budget_mb=400, margin=0.1)


# ----- CPU throughput search -----
def test_throughput_search_stops_where_tokens_per_second_stop_improving() -> None:
    probe = FakeThroughputProbe(overhead_s=0.01, rate=20_000.0)
    tokens, details, rows, notes = search_throughput_budget(probe, max_seq_len=128, latency_bound_s=10.0)
    by_budget = {r["max_batch_tokens"]: r["tokens_per_second"] for r in details["rows"]}
    best = max(by_budget.values())
    assert by_budget[tokens] >= 0.97 * best
    assert all(v < 0.97 * best for b, v in by_budget.items() if b < tokens), "a smaller budget was as good"
    assert rows and {r["seq_len"] for r in rows} == {32, 64, 128}


def test_throughput_search_respects_the_latency_bound_and_a_slowdown() -> None:
    probe = FakeThroughputProbe(overhead_s=0.01, rate=20_000.0)
    tokens, details, _, _ = search_throughput_budget(probe, max_seq_len=128, latency_bound_s=0.1)
    chosen = next(r for r in details["rows"] if r["max_batch_tokens"] == tokens)
    assert chosen["worst_batch_seconds"] <= 0.1
    slowing = FakeThroughputProbe(overhead_s=0.01, rate=20_000.0, slow_past_tokens=1024)
    tokens, _, _, _ = search_throughput_budget(slowing, max_seq_len=128, latency_bound_s=10.0)
    assert tokens == 1024


def test_throughput_search_counts_the_batches_labelled_side_by_side() -> None:
    one = FakeThroughputProbe(overhead_s=0.01, rate=20_000.0)
    two = FakeThroughputProbe(overhead_s=0.01, rate=20_000.0, parallel_calls=2)  # same seconds, two batches
    _, one_details, _, _ = search_throughput_budget(one, max_seq_len=128, latency_bound_s=10.0)
    _, two_details, _, _ = search_throughput_budget(two, max_seq_len=128, latency_bound_s=10.0)
    for alone, side_by_side in zip(one_details["rows"], two_details["rows"], strict=True):
        assert side_by_side["tokens_per_second"] == pytest.approx(2 * alone["tokens_per_second"])
        assert side_by_side["worst_batch_seconds"] == alone["worst_batch_seconds"]  # each call's latency


def test_a_budget_tuned_for_one_call_at_a_time_is_not_reused_for_calls_side_by_side(tmp_path: Path) -> None:
    first = tune(
        FakeClassifier(), _options(tmp_path), throughput_probe=FakeThroughputProbe(), device=("cpu", "c"),
        paddle_version="3",
    )  # fmt: skip
    side_by_side = FakeClassifier()
    side_by_side.parallel_calls = 2  # type: ignore[misc]
    probe = FakeThroughputProbe(parallel_calls=2)
    second = tune(
        side_by_side, _options(tmp_path), throughput_probe=probe, device=("cpu", "c"), paddle_version="3"
    )
    assert not first.from_cache and not second.from_cache and probe.calls  # measured again


# ----- entry point and cache -----
def _options(tmp_path: Path, **extra: object) -> TuneOptions:
    return TuneOptions(max_seq_len=128, cache_dir=tmp_path / "cache", **extra)  # type: ignore[arg-type]


def test_tune_caches_by_key_and_reuses_it(tmp_path: Path) -> None:
    classifier = FakeClassifier()
    probe = FakeMemoryProbe()

    def tune_on_the_gpu() -> TuningResult:
        return tune(
            classifier,
            _options(tmp_path),
            memory_probe=probe,
            device=("gpu", "Fake A100"),
            paddle_version="3.3.1",
        )

    first = tune_on_the_gpu()
    assert first.mode == "gpu-memory" and not first.from_cache and probe.calls
    path = cache_path(tmp_path / "cache", first.key)
    stored = json.loads(path.read_text())
    assert stored["result"]["max_batch_tokens"] == first.max_batch_tokens
    assert first.key["device_name"] == "Fake A100" and first.key["model_version"] == "v1"

    probe.calls.clear()
    again = tune_on_the_gpu()
    assert again.from_cache and not probe.calls
    assert again.max_batch_tokens == first.max_batch_tokens

    misses = [
        (FakeClassifier(version="v2"), _options(tmp_path), ("gpu", "Fake A100"), "3.3.1"),
        (classifier, _options(tmp_path), ("gpu", "Fake H100"), "3.3.1"),
        (classifier, _options(tmp_path), ("gpu", "Fake A100"), "3.4.0"),
        (classifier, _options(tmp_path, safety_margin=0.3), ("gpu", "Fake A100"), "3.3.1"),
        (classifier, _options(tmp_path, vram_budget_mb=1024), ("gpu", "Fake A100"), "3.3.1"),
    ]
    for other, options, device, paddle_version in misses:
        probe.calls.clear()
        result = tune(other, options, memory_probe=probe, device=device, paddle_version=paddle_version)
        assert not result.from_cache and probe.calls, f"cache hit for a different key: {result.key}"
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1 + len(misses)


def test_tune_measures_again_when_the_cache_is_corrupt_or_disabled(tmp_path: Path) -> None:
    classifier, probe = FakeClassifier(), FakeMemoryProbe()
    first = tune(classifier, _options(tmp_path), memory_probe=probe, device=("gpu", "g"), paddle_version="3")
    cache_path(tmp_path / "cache", first.key).write_text("{not json")
    probe.calls.clear()
    assert not tune(
        classifier, _options(tmp_path), memory_probe=probe, device=("gpu", "g"), paddle_version="3"
    ).from_cache
    assert probe.calls
    probe.calls.clear()
    forced = tune(
        classifier,
        _options(tmp_path, use_cache=False),
        memory_probe=probe,
        device=("gpu", "g"),
        paddle_version="3",
    )
    assert not forced.from_cache and probe.calls


def test_tune_on_cpu_says_it_tuned_for_throughput(tmp_path: Path) -> None:
    probe = FakeThroughputProbe()
    result = tune(
        FakeClassifier(),
        _options(tmp_path),
        throughput_probe=probe,
        device=("cpu", "cpu x2"),
        paddle_version="3",
    )
    assert result.mode == "cpu-throughput"
    assert "throughput, not memory" in result.notes[0]
    assert result.max_batch_tokens >= 128 and probe.calls


def test_options_from_settings_and_flags() -> None:
    settings = WorkerSettings(vram_budget_fraction=0.5, vram_safety_margin=0.2, tuning_latency_bound_ms=250)
    options = TuneOptions.from_settings(settings.sections.batching, 128)
    assert (options.vram_budget_fraction, options.safety_margin, options.latency_bound_s) == (0.5, 0.2, 0.25)
    flagged = TuneOptions.from_settings(settings.sections.batching, 128, vram_budget_mb=2048)
    assert (flagged.vram_budget_mb, flagged.vram_budget_fraction) == (2048, None)
    with pytest.raises(ValueError):
        TuneOptions.from_settings(settings.sections.batching, 128, safety_margin=1.5)


def test_settings_accept_auto_token_budget_and_one_kind_of_vram_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SENTIMENT_MAX_BATCH_TOKENS", "auto")
    auto = WorkerSettings()
    assert auto.max_batch_tokens_auto and auto.max_batch_tokens == 4096
    monkeypatch.setenv("SENTIMENT_MAX_BATCH_TOKENS", "2048")
    fixed = WorkerSettings()
    assert not fixed.max_batch_tokens_auto and fixed.max_batch_tokens == 2048
    with pytest.raises(ValueError, match="not both"):
        WorkerSettings(vram_budget_mb=1024, vram_budget_fraction=0.5)
    with pytest.raises(ValueError):
        WorkerSettings(vram_budget_fraction=1.2)


def test_synthetic_probe_batches_have_the_exact_shape() -> None:
    batch = synthetic_batch(FakeClassifier(), 4, 10)
    assert len(batch) == 4 and all(len(row) == 10 for row in batch)
    assert batch[0][0] == 1 and batch[0][-1] == 2


# ----- the real GPU probe -----
@pytest.mark.gpu
def test_real_gpu_calibration_fits_the_budget(tiny_model_dir: Path, tmp_path: Path) -> None:
    import paddle

    from worker.inference.tuning.probes import PaddleCudaMemoryProbe
    from worker.model.device import choose_device
    from worker.model.loading import load_classifier

    choice: DeviceChoice = choose_device("gpu")
    classifier = load_classifier(str(tiny_model_dir), choice)
    probe = PaddleCudaMemoryProbe(classifier)
    options = TuneOptions(max_seq_len=classifier.max_seq_len, vram_budget_mb=512, cache_dir=tmp_path)
    result = tune(classifier, options, memory_probe=probe)
    assert result.mode == "gpu-memory"
    limit = result.details["budget"]["limit_bytes"]
    assert 0 < result.details["verified"]["peak_bytes"] <= limit
    # Probes reset the statistics: a small batch after a big one reports a small peak.
    big = probe.peak_bytes(result.max_batch_tokens // classifier.max_seq_len, classifier.max_seq_len)
    small = probe.peak_bytes(1, 16)
    assert small < big
    assert paddle.device.cuda.max_memory_allocated(0) == small
