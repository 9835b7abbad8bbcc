"""One ONNX Runtime call across all CPU threads against single-threaded calls side by side
(`cpu_threads_per_call`, 2026-12-03), on one served model. Windows of 32 and 256 reviews of the bench's
review mix (`review_texts`) are labelled through a Labeller (tokenizer, planner, model: the engine every
command uses), the two settings alternating, for `--rounds` rounds; each line prints reviews/s, process CPU
ms per review, padding efficiency and reviews per call, and the end prints per window the medians and the
side-by-side / one-call ratio.

    OMP_NUM_THREADS=2 KMP_BLOCKTIME=1 OMP_WAIT_POLICY=PASSIVE \\
        .venv/bin/python benchmarks/cpu_threads_per_call.py models/fast-int8 [--reviews 4096] [--rounds 3]

Both classifiers are loaded as `run` loads them (settings from the environment, then `cpu_threads_per_call`
set to 1 and to all threads); set the idle-thread variables as `run` and `serve` do (above).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from functools import partial

from batch_planner import alternate, command_line, label_in_windows

from worker.bench.bench import review_texts
from worker.config import WorkerSettings
from worker.inference.engine import EngineOptions
from worker.labelling.labeller import Labeller
from worker.labelling.loading import load_model

WINDOWS = (32, 256)


def main(model: str, reviews: int, rounds: int) -> None:
    base = WorkerSettings(model=model, device="cpu")
    threads = base.cpu_threads or os.cpu_count() or 1
    arms: dict[str, Labeller] = {}
    for name, per_call in (("one call", threads), ("side by side", 1)):
        s = base.model_copy(update={"cpu_threads_per_call": per_call}).sections
        classifier = load_model(s.model, s.batching).classifier
        if getattr(classifier, "backend", None) != "onnx":
            raise SystemExit(
                f"{model}: served by {classifier!r}; the setting applies to the onnx backend only"
            )
        options = EngineOptions(s.batching.max_batch_size, s.batching.max_batch_tokens)
        arms[name] = Labeller.of(classifier, options, name=name)
        print(
            f"{name:>12}: {classifier.parallel_calls} calls x {threads // classifier.parallel_calls} threads"
        )
    texts = review_texts(reviews, seed=7)
    print(f"{model}: {reviews} reviews, {threads} threads, budget {base.max_batch_tokens} tokens")
    with ExitStack() as stack:
        for labeller in arms.values():
            stack.enter_context(labeller.session())
            label_in_windows(labeller, texts[:512], 256)  # warm-up
        alternate({name: partial(_same, lab) for name, lab in arms.items()}, texts, WINDOWS, rounds)


def _same(labeller: Labeller) -> Labeller:
    return labeller


if __name__ == "__main__":
    command_line(main, __doc__)
