"""`bench`'s model-only phase runs the engine as the worker and `predict` do: the next window is tokenized
while the model labels this one (so its rate is the engine's best, not a serial lower bound)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.model_wrappers import SLOW_MARKER, StallOn
from worker.bench.bench import bench_model_only
from worker.model.device import choose_device
from worker.model.loading import load_classifier
from worker.training.evaluate import HELDOUT_FILE, read_heldout


class _Timeline(StallOn):
    """The tiny model, stalling on the marked window, recording when each window was tokenized and labelled
    and on which thread."""

    def __init__(self, inner: Any, stall_s: float) -> None:
        super().__init__(inner, stall_s)
        self.events: list[tuple[str, float, str]] = []

    def token_ids(self, texts: Any) -> list[list[int]]:
        self.events.append(("tokenize", time.monotonic(), threading.current_thread().name))
        return super().token_ids(texts)

    def predict_ids(self, batch: Any) -> Any:
        out = super().predict_ids(batch)
        self.events.append(("labelled", time.monotonic(), threading.current_thread().name))
        return out


def test_the_next_window_is_tokenized_while_the_model_labels_this_one(tiny_model_dir: Path) -> None:
    classifier = _Timeline(load_classifier(str(tiny_model_dir), choose_device("cpu")), stall_s=0.6)
    texts = [ex.text for ex in read_heldout(tiny_model_dir / HELDOUT_FILE)][:48]
    texts[0] = SLOW_MARKER + texts[0]  # the first window's batch stalls in the model
    phase = bench_model_only(classifier, texts, window=16, max_batch_size=32, max_batch_tokens=4096)

    assert (phase.messages, phase.results, phase.dead_letters) == (48, 48, 0)
    assert phase.extra["queued_windows"] == 2 and phase.extra["window_messages"] == 16
    kinds = [kind for kind, _, _ in classifier.events]
    phase_events = classifier.events[kinds.index("tokenize", 1) :]  # after the warm-up's call
    tokenized = [t for kind, t, _ in phase_events if kind == "tokenize"]
    labelled = [(t, name) for kind, t, name in phase_events if kind == "labelled"]
    assert len(tokenized) == 3  # one call per window
    # window 2 was tokenized before window 1 (stalled 0.6 s in the model) came out: the two overlapped
    assert tokenized[1] < labelled[0][0] - 0.3
    assert all(name.startswith("model-only-lane") for _, name in labelled)  # on the engine's own lanes
