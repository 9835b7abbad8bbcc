"""One ONNX Runtime call across all CPU threads against single-threaded calls side by side
(`cpu_threads_per_call`, 2026-12-03), on one served model. Windows of 32 and 256 reviews of the bench's
review mix (`review_texts`) are labelled through `label_texts` (tokenizer, planner, model: the engine every
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

from batch_planner import alternate, command_line, label_in_windows

from worker.bench.bench import review_texts
from worker.config import WorkerSettings
from worker.labelling.loading import load_model

WINDOWS = (32, 256)


def main(model: str, reviews: int, rounds: int) -> None:
    base = WorkerSettings(model=model, device="cpu")
    threads = base.cpu_threads or os.cpu_count() or 1
    arms = {}
    for name, per_call in (("one call", threads), ("side by side", 1)):
        classifier, _, _ = load_model(base.model_copy(update={"cpu_threads_per_call": per_call}))
        if getattr(classifier, "backend", None) != "onnx":
            raise SystemExit(
                f"{model}: served by {classifier!r}; the setting applies to the onnx backend only"
            )
        arms[name] = classifier
        print(
            f"{name:>12}: {classifier.parallel_calls} calls x {threads // classifier.parallel_calls} threads"
        )
    texts = review_texts(reviews, seed=7)
    print(f"{model}: {reviews} reviews, {threads} threads, budget {base.max_batch_tokens} tokens")
    for classifier in arms.values():
        label_in_windows(classifier, texts[:512], 256, base)  # warm-up
    alternate({name: (lambda c=c: c) for name, c in arms.items()}, texts, WINDOWS, rounds, base)


if __name__ == "__main__":
    command_line(main, __doc__)
