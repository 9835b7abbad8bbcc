"""The batch planner's two ways of cutting a window, side by side on one served model: fewest batches
(`call_overhead_tokens` None, the planner before 2026-12-03) against the cheapest cut for the backend's
declared cost of a call. Windows of 32, 64 and 256 reviews of the bench's review mix (`review_texts`) are
labelled through the Labeller (tokenizer, planner, model: one window at a time), the two plans
alternating, for `--rounds` rounds; each line prints reviews/s, process CPU ms per review, padding
efficiency and reviews per call, and the end prints per window the medians and the cut / fewest ratio.

    OMP_NUM_THREADS=2 KMP_BLOCKTIME=1 OMP_WAIT_POLICY=PASSIVE \\
        .venv/bin/python benchmarks/batch_planner.py models/fast-int8 [--reviews 4096] [--rounds 3]

The classifier is loaded as `run` loads it (settings from the environment); set the idle-thread variables
as `run` and `serve` do (above) to measure what they see.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from schemas.review_input import Review
from worker.bench.bench import review_texts
from worker.config import WorkerSettings
from worker.inference.classifier import Classifier
from worker.inference.engine import EngineOptions
from worker.labelling.labeller import Labeller
from worker.labelling.loading import load_model

WINDOWS = (32, 64, 256)


def label_in_windows(labeller: Labeller, texts: list[str], window: int) -> tuple[float, float, float, float]:
    """(reviews/s, CPU ms per review, padding efficiency, reviews per call) over `texts` cut in windows,
    each labelled before the next is submitted."""
    reviews = [Review(str(i), text, {}) for i, text in enumerate(texts)]
    wall, cpu = time.perf_counter(), time.process_time()
    real = padded = calls = 0
    for start in range(0, len(reviews), window):
        stats = labeller.label(reviews[start : start + window]).result().stats
        real, padded, calls = (
            real + stats.real_tokens,
            padded + stats.padded_tokens,
            calls + len(stats.batches),
        )
    seconds, cpu_s = time.perf_counter() - wall, time.process_time() - cpu
    return len(texts) / seconds, cpu_s * 1000 / len(texts), real / padded, len(texts) / calls


def alternate(
    arms: dict[str, Callable[[], Labeller]], texts: list[str], windows: Sequence[int], rounds: int
) -> None:
    """Labels `texts` in windows of each size with each arm (a callable giving the Labeller to use, set up
    for that arm), the arms alternating within every round; prints each run, then per window the medians of
    the first two arms and their ratio (second / first)."""
    rates: dict[tuple[int, str], list[float]] = defaultdict(list)
    width = max(len(name) for name in arms)
    for round_no in range(1, rounds + 1):
        for window in windows:
            for name, arm in arms.items():
                rate, cpu_ms, efficiency, per_call = label_in_windows(arm(), texts, window)
                rates[window, name].append(rate)
                print(
                    f"round {round_no} window {window:3d} {name:>{width}}: {rate:7.1f} reviews/s, "
                    f"CPU {cpu_ms:6.3f} ms/review, padding efficiency {efficiency:.2f}, "
                    f"{per_call:4.1f} reviews/call",
                    flush=True,
                )
    first, second = list(arms)[:2]
    for window in windows:
        a, b = (statistics.median(rates[window, name]) for name in (first, second))
        print(f"window {window:3d}: median {a:7.1f} ({first}) against {b:7.1f} ({second}), ratio {b / a:.2f}")


def main(model: str, reviews: int, rounds: int) -> None:
    s = WorkerSettings(model=model, device="cpu").sections
    classifier: Classifier = load_model(s.model, s.batching).classifier
    declared = classifier.call_overhead_tokens
    if declared is None:
        raise SystemExit(f"{model}: its backend declares no call cost here, so both plans are the same")
    options = EngineOptions(s.batching.max_batch_size, s.batching.max_batch_tokens)
    labeller = Labeller.of(classifier, options, name="batch-planner")

    def planned_with(cost: int | None) -> Callable[[], Labeller]:
        def arm() -> Labeller:
            classifier.call_overhead_tokens = cost  # the engine reads it when it plans each window
            return labeller

        return arm

    texts = review_texts(reviews, seed=7)
    print(f"{model}: {classifier!r}; {reviews} reviews, budget {s.batching.max_batch_tokens} tokens")
    with labeller.session():
        label_in_windows(labeller, texts[:512], 256)  # warm-up
        alternate({"fewest": planned_with(None), "cut": planned_with(declared)}, texts, WINDOWS, rounds)
    classifier.call_overhead_tokens = declared


def command_line(main: Callable[[str, int, int], None], doc: str) -> None:
    """`MODEL [--reviews N] [--rounds N]` → main(model, reviews, rounds); help: `doc`'s first paragraph."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--reviews", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    main(args.model, args.reviews, args.rounds)


if __name__ == "__main__":
    command_line(main, __doc__)
