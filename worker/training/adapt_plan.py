"""How an `adapt` step is run on the device it has: micro-batches and gradient accumulation so the recipe
batch fits the GPU's memory budget, AMP with a loss scaler on a GPU; and the time estimate printed before
the work starts.

The memory probe is injected like the inference tuner's (`worker.inference.tuning.probes.MemoryProbe`, the
same protocol), so the GPU path is tested on CPU with a fake probe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

MEMORY_BUDGET = 0.8
"""Share of the device's memory one training micro-batch may use at its peak (activations, gradients and
optimizer state included); the rest is left to the allocator and other tenants."""


class TrainMemoryProbe(Protocol):
    """Measures the device memory one training step (forward, backward) needs for one batch shape."""

    def peak_bytes(self, batch_size: int, seq_len: int) -> int:
        """Peak allocated device bytes of a [batch_size, seq_len] step; raises the framework's
        out-of-memory error when it does not fit."""
        ...

    def device_total_bytes(self) -> int:
        """The device's total memory in bytes."""
        ...


@dataclass(frozen=True)
class StepPlan:
    """How one optimizer step runs: `accum_steps` micro-batches of at most `micro_batch` examples, under
    AMP (float16 autocast + a dynamic loss scaler) or not."""

    micro_batch: int
    accum_steps: int
    amp: bool
    why: str

    def describe(self) -> str:
        return (
            f"{self.micro_batch} x {self.accum_steps} accumulated"
            + (", AMP (O1) with a dynamic loss scaler" if self.amp else "")
            + f" ({self.why})"
        )


def plan_step(
    recipe_batch: int,
    seq_len: int,
    *,
    device_kind: str,
    amp: bool,
    micro_batch: int | None = None,
    memory_probe: TrainMemoryProbe | None = None,
    budget: float = MEMORY_BUDGET,
) -> StepPlan:
    """The micro-batch for `recipe_batch` examples of up to `seq_len` tokens: `micro_batch` when given;
    on a GPU with a probe, the largest power-of-two share of the recipe batch whose measured peak fits
    `budget` of the device (halving on a measured excess or an out-of-memory error); else the whole batch.
    AMP only on a GPU."""
    use_amp = amp and device_kind == "gpu"
    if micro_batch is not None:
        return StepPlan(micro_batch, -(-recipe_batch // micro_batch), use_amp, "--micro-batch")
    if device_kind != "gpu" or memory_probe is None:
        return StepPlan(recipe_batch, 1, use_amp, "the whole recipe batch per pass")
    limit = int(memory_probe.device_total_bytes() * budget)
    size = recipe_batch
    while size >= 1:
        try:
            peak = memory_probe.peak_bytes(size, seq_len)
        except Exception as exc:  # noqa: BLE001 - each framework names its out-of-memory error differently
            if "memory" not in str(exc).lower() and "oom" not in type(exc).__name__.lower():
                raise
            peak = limit + 1
        if peak <= limit:
            why = (
                f"a [{size}, {seq_len}] step peaks at {peak / 2**30:.2f} GiB of the "
                f"{limit / 2**30:.2f} GiB budget"
            )
            return StepPlan(size, -(-recipe_batch // size), use_amp, why)
        size //= 2
    raise MemoryError(
        f"even one review of {seq_len} tokens does not fit {budget:.0%} of the GPU's memory: lower "
        "--max-seq-len, or train on CPU (--device cpu)"
    )


class PaddleTrainMemoryProbe:
    """The real probe: one forward and backward pass of `model` on a synthetic batch, the peak read from
    Paddle's CUDA allocator statistics (the gradients are cleared afterwards; no weight changes)."""

    def __init__(self, model: Any, pad_id: int, filler_id: int, amp: bool) -> None:
        self._model, self._pad_id, self._filler, self._amp = model, pad_id, filler_id, amp

    def peak_bytes(self, batch_size: int, seq_len: int) -> int:
        import paddle

        paddle.device.cuda.empty_cache()
        paddle.device.cuda.reset_max_memory_allocated()
        ids = paddle.full([batch_size, seq_len], self._filler, dtype="int64")
        mask = paddle.ones([batch_size, seq_len], dtype="int64")
        with paddle.amp.auto_cast(enable=self._amp, level="O1"):
            logits = self._model(ids, token_type_ids=paddle.zeros_like(ids), attention_mask=mask)
        logits = logits[0] if isinstance(logits, (tuple, list)) else logits
        logits.astype("float32").mean().backward()
        self._model.clear_gradients()
        return int(paddle.device.cuda.max_memory_allocated())

    def device_total_bytes(self) -> int:
        import paddle

        return int(paddle.device.cuda.get_device_properties().total_memory)


@dataclass(frozen=True)
class Estimate:
    """The time a run will take, from one measured step and a measured evaluation rate."""

    step_seconds: float
    steps: int
    evaluations: int
    eval_rows: int
    eval_rows_per_second: float
    final_rows: int

    @property
    def final_seconds(self) -> float:
        """The closing evaluation: calibration on dev, both held-out sets."""
        return self.final_rows / max(self.eval_rows_per_second, 1e-9)

    @property
    def seconds(self) -> float:
        evaluation = (self.evaluations * self.eval_rows + self.final_rows) / max(
            self.eval_rows_per_second, 1e-9
        )
        return self.steps * self.step_seconds + evaluation

    def describe(self) -> str:
        return (
            f"estimate: {self.seconds / 60:.1f} min ({self.steps} steps x {self.step_seconds:.2f} s "
            "measured, "
            f"{self.evaluations} evaluations of {self.eval_rows} dev reviews and the held-out sets at "
            f"{self.eval_rows_per_second:.0f} reviews/s)"
        )


def measure(run: Callable[[], object], repeats: int = 2) -> float:
    """Seconds of `run()` (the fastest of `repeats` after one warm-up)."""
    import time

    run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best
