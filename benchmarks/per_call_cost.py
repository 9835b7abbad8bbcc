"""What one model call costs on a served model directory: `predict_ids` timed on one review of a fixed
length, one review at a time in held-out order (varying lengths), and 30 reviews padded to the longest; the
first fifth of each series is dropped as warm-up, the median printed in ms.

    OMP_NUM_THREADS=2 [KMP_BLOCKTIME=1 OMP_WAIT_POLICY=PASSIVE] [SENTIMENT_BACKEND=onnx] \\
        .venv/bin/python benchmarks/per_call_cost.py models/fast-int8

The classifier is loaded as `run` loads it (settings from the environment). Set the idle-thread variables
yourself: this script, unlike `run` and `serve`, leaves them as they are, so policies can be compared.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from worker.cli.common import load_model
from worker.config import WorkerSettings


def median_ms(classifier: object, batches: Sequence[Sequence[Sequence[int]]]) -> float:
    times = []
    for batch in batches:
        started = time.perf_counter()
        classifier.predict_ids(batch)  # type: ignore[attr-defined]
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[len(times) // 5 :])


def main(model: str) -> None:
    classifier, _ = load_model(WorkerSettings(model=model, device="cpu"))
    heldout = Path(model) / "heldout.jsonl"
    if not heldout.exists():
        heldout = Path("models/default/heldout.jsonl")
    texts = [json.loads(line)["text"] for line in heldout.read_text(encoding="utf-8").splitlines()[:600]]
    seqs = [classifier.token_ids([text])[0] for text in texts]
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
