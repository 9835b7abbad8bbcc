"""GPU-shaped batching, on fake devices: on a GPU a batch is bounded by the token budget (calibrated to the
device memory budget by default), not by max_batch_size 32; a Kafka window grows to fill such a batch while
a trickle still leaves within max_wait_ms; on CPU the measured plan is unchanged; out of memory still
splits. The real GPU path: the `gpu`-marked tests in test_tuning.py."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.labellers import engine_options
from tests.polling import wait_until
from worker.config import WorkerSettings
from worker.inference.batch_plan import plan_batches
from worker.inference.batch_shape import TextLengths, batch_size_cap
from worker.inference.engine import Engine, EngineOptions
from worker.inference.token_budget import BudgetChoice, choose_token_budget
from worker.inference.tuning import MIB
from worker.model.device import DeviceChoice

GPU = DeviceChoice("gpu", "gpu:0", "test", "Fake H200")
CPU = DeviceChoice("cpu", "cpu", "test", "Fake Xeon")


class FakeDeviceClassifier:
    """Tokens = one per character + 2 ([CLS], [SEP]); 'probability positive' encodes the text's length so
    outputs can be matched to inputs. Records each model call's sequence lengths; a call over
    `oom_over_tokens` padded tokens raises the GPU's out-of-memory error. `parallel_calls` 1, as on a GPU."""

    labels = ["negative", "positive"]
    call_overhead_tokens = None  # fewest batches, as the GPU backends
    parallel_calls = 1
    name = "fake-model"
    version = "v1"
    backend = "dynamic"  # a Paddle backend: the real GPU memory probe would see its memory
    max_seq_len = 128

    def __init__(self, device: DeviceChoice, *, oom_over_tokens: int | None = None) -> None:
        self.device = device
        self.oom_over_tokens = oom_over_tokens
        self.batches: list[list[int]] = []  # the lengths of each call that returned labels
        self.tokenized: list[int] = []  # texts per tokenizer call
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        self.tokenized.append(len(texts))
        return [[1, *([7] * len(text)), 2] for text in texts]

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        self.entered.set()
        self.gate.wait(10)
        padded = len(batch) * max(len(row) for row in batch)
        if self.oom_over_tokens is not None and padded > self.oom_over_tokens:
            raise RuntimeError("ResourceExhaustedError: Out of memory error on GPU 0")
        self.batches.append([len(row) for row in batch])
        p = np.array([len(row) / 1000.0 for row in batch], dtype=np.float32)
        return np.stack([1 - p, p], axis=1)


class FakeH200MemoryProbe:
    """Peak device bytes as measured for this model in fp16 on an H200: linear in padded tokens, 13.3 KB
    each, on top of the weights; a 140 GiB device."""

    def __init__(self) -> None:
        self.calls = 0

    def peak_bytes(self, batch_size: int, seq_len: int) -> int:
        self.calls += 1
        return 200 * MIB + 13_300 * batch_size * seq_len

    def device_total_bytes(self) -> int:
        return 140 * 1024 * MIB


def backlog(n: int = 2000) -> list[str]:
    """`n` reviews of 46 to 54 characters (48 to 56 tokens, ~50 on average), in no order of length."""
    return ["好" * (46 + (i * 7) % 9) for i in range(n)]


def padded(lengths: list[int]) -> int:
    return len(lengths) * max(lengths)


def cap(settings: WorkerSettings, classifier: object) -> int | None:
    return batch_size_cap(settings.sections.batching, settings.sections.model, classifier)


def budget(settings: WorkerSettings, classifier: Any, **kwargs: Any) -> BudgetChoice:
    return choose_token_budget(settings.sections.batching, settings.sections.model, classifier, **kwargs)


def gpu_settings(tmp_path: Path, **extra: object) -> WorkerSettings:
    """A GPU worker's settings as a user leaves them (no batch size, token budget or window set), with
    1,400 MiB of device memory for inference: about 80,000 padded tokens of this model."""
    values: dict[str, object] = {"tuning_cache_dir": tmp_path, "vram_budget_mb": 1400, **extra}
    return WorkerSettings(**values)  # type: ignore[arg-type]


# ----- the batches -----
def test_on_a_gpu_a_backlog_is_planned_into_batches_bounded_by_the_calibrated_token_budget(
    tmp_path: Path,
) -> None:
    fake, probe = FakeDeviceClassifier(GPU), FakeH200MemoryProbe()
    options = engine_options(gpu_settings(tmp_path), fake, memory_probe=probe)
    assert probe.calls  # the default budget on a GPU is measured against the device memory budget
    assert options.max_batch_size is None  # no count cap
    assert options.max_batch_tokens >= 65_536
    texts = backlog()
    with Engine(fake, options).start(warm_up=False) as engine:
        labelled = engine.submit(texts).result(30)

    assert [round(float(o[1]) * 1000) for o in labelled.outputs] == [len(t) + 2 for t in texts]  # in order
    assert sum(len(b) for b in fake.batches) == 2000
    assert all(padded(b) <= options.max_batch_tokens for b in fake.batches)  # bounded by tokens
    assert len(fake.batches) == 2 and max(len(b) for b in fake.batches) > 1000  # not by 32 texts


def test_on_a_gpu_max_batch_size_caps_batches_only_when_set_or_with_tensorrt(tmp_path: Path) -> None:
    gpu, cpu = FakeDeviceClassifier(GPU), FakeDeviceClassifier(CPU)
    assert cap(gpu_settings(tmp_path), gpu) is None
    assert cap(gpu_settings(tmp_path, max_batch_size=64), gpu) == 64
    assert cap(gpu_settings(tmp_path, use_tensorrt=True), gpu) == 32  # its engine's largest batch
    assert cap(WorkerSettings(), cpu) == 32


def test_on_a_gpu_a_token_budget_that_is_set_is_used_as_it_is(tmp_path: Path) -> None:
    fake, probe = FakeDeviceClassifier(GPU), FakeH200MemoryProbe()
    settings = gpu_settings(tmp_path, max_batch_tokens=262_144)
    choice = budget(settings, fake, memory_probe=probe)
    assert (choice.max_batch_tokens, choice.source, probe.calls) == (262_144, "max_batch_tokens", 0)
    turned_off = gpu_settings(tmp_path, max_batch_tokens_auto=False)
    assert budget(turned_off, fake, memory_probe=probe).max_batch_tokens == 4096
    assert probe.calls == 0


def test_on_a_gpu_an_onnx_model_whose_memory_is_not_measured_gets_a_gpu_sized_default(tmp_path: Path) -> None:
    onnx = FakeDeviceClassifier(GPU)
    onnx.backend = "onnx"  # ONNX Runtime allocates device memory Paddle's probe does not see
    choice = budget(gpu_settings(tmp_path), onnx)
    assert choice == BudgetChoice(65_536, "GPU default (onnx backend)")
    assert not list(tmp_path.iterdir())  # nothing calibrated


def test_on_cpu_the_measured_plan_is_unchanged(tmp_path: Path) -> None:
    fake, probe = FakeDeviceClassifier(CPU), FakeH200MemoryProbe()
    options = engine_options(WorkerSettings(tuning_cache_dir=tmp_path), fake, memory_probe=probe)
    assert (options.max_batch_size, options.max_batch_tokens, probe.calls) == (32, 4096, 0)
    texts = backlog()
    with Engine(fake, options).start(warm_up=False) as engine:
        engine.submit(texts).result(30)
    lengths = [len(t) + 2 for t in texts]
    planned = plan_batches(lengths, max_batch_size=32, max_batch_tokens=4096)
    assert sorted(len(b) for b in fake.batches) == sorted(len(b) for b in planned)
    assert max(len(b) for b in fake.batches) == 32 and len(fake.batches) == len(planned) == 63


def test_out_of_memory_still_splits_an_uncapped_batch_and_lowers_the_budget() -> None:
    fake = FakeDeviceClassifier(GPU, oom_over_tokens=30_000)
    texts = backlog()
    with Engine(fake, EngineOptions(None, 131_072)).start(warm_up=False) as engine:
        labelled = engine.submit(texts).result(30)
        assert engine.out_of_memory_lowerings >= 1 and engine.token_budget <= 30_000
    assert [round(float(o[1]) * 1000) for o in labelled.outputs] == [len(t) + 2 for t in texts]
    assert labelled.stats.splits >= 1 and labelled.stats.out_of_memory_events >= 1
    assert all(padded(b) <= 30_000 for b in fake.batches) and max(len(b) for b in fake.batches) > 32


def test_the_queue_thread_prepares_the_next_window_while_the_device_runs_the_current_one() -> None:
    fake = FakeDeviceClassifier(GPU)
    with Engine(fake, EngineOptions(None, 65_536)).start(warm_up=False) as engine:
        fake.gate.clear()
        first = engine.submit(backlog(1000))
        assert fake.entered.wait(5)  # the device runs the first window's batch ...
        second = engine.submit(backlog(1000))
        # ... while the second is tokenized and planned behind it
        wait_until(lambda: fake.tokenized == [1000, 1000], 5, "the second window tokenized")
        assert not first.done() and fake.batches == []
        fake.gate.set()
        first.result(10), second.result(10)
    assert [len(b) for b in fake.batches] == [1000, 1000]


def test_without_a_count_cap_gathering_requests_leave_once_they_fill_the_token_budget() -> None:
    fake = FakeDeviceClassifier(GPU)
    with Engine(fake, EngineOptions(None, 1000)).start(warm_up=False) as engine:
        assert engine.tokens_per_text is None
        engine.submit(["好" * 8] * 10).result(10)  # 10 tokens a text
        assert engine.tokens_per_text == pytest.approx(10.0)
        # An idle model would wait up to gather_ms for company; 100 texts of 10 tokens fill the budget.
        full = engine.submit(["好" * 8] * 100, gather_ms=600_000)
        assert len(full.result(10).outputs) == 100
    assert [len(b) for b in fake.batches] == [10, 100]


def test_the_warm_up_is_not_taken_for_the_traffic_s_length() -> None:
    fake = FakeDeviceClassifier(GPU)
    with Engine(fake, EngineOptions(None, 65_536)) as engine:  # started and warmed up
        assert engine.tokens_per_text is None
        engine.submit(["好" * 48, "好" * 50]).result(10)
        assert engine.tokens_per_text == pytest.approx(51.0)


def test_text_lengths_follow_the_recent_traffic() -> None:
    lengths = TextLengths(memory_texts=1000)
    assert lengths.mean is None
    lengths.observe(1000, 50_000)
    assert lengths.mean == pytest.approx(50.0)
    for _ in range(10):  # the traffic turns to 100-token reviews: the old ones fade by halves
        lengths.observe(1000, 100_000)
    assert lengths.mean == pytest.approx(100.0, rel=0.01)
