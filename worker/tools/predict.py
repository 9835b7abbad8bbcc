"""Offline labelling of text lines (the `predict` command): no Kafka, same model path as the worker."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from worker.stream.decode import DecodedReview, decode_review
from worker.stream.inference import Classifier, InferenceFailure, label_texts

_CHUNK_LINES = 512


def predict_lines(
    classifier: Classifier,
    lines: Iterable[str],
    *,
    max_batch_size: int = 32,
    max_batch_tokens: int = 4096,
    max_text_chars: int = 10_000,
) -> Iterator[dict[str, Any]]:
    """One output dict per input line, in input order: a label, or an `error` kind with its reason."""
    numbered = enumerate(lines, start=1)
    while chunk := list(islice(numbered, _CHUNK_LINES)):
        decoded = [
            decode_review(
                line.rstrip("\r\n").encode("utf-8", "surrogateescape"),
                input_format="text",
                max_value_bytes=4 * max_text_chars + 4,
                max_text_chars=max_text_chars,
                max_json_depth=1,
                default_id=str(number),
            )
            for number, line in chunk
        ]
        valid = [d for d in decoded if isinstance(d, DecodedReview)]
        outputs, _ = label_texts(
            classifier,
            [d.text for d in valid],
            max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens,
        )
        predictions = iter(outputs)
        for (number, _line), review in zip(chunk, decoded, strict=True):
            if not isinstance(review, DecodedReview):
                yield {"line": number, "error": review.kind.value, "reason": review.reason}
                continue
            output = next(predictions)
            if isinstance(output, InferenceFailure):
                yield {
                    "line": number,
                    "text": review.text,
                    "error": output.kind.value,
                    "reason": output.reason,
                }
                continue
            label_id = int(output.argmax())
            yield {
                "line": number,
                "text": review.text,
                "label": classifier.labels[label_id],
                "label_id": label_id,
                "confidence": round(float(output[label_id]), 6),
                "probabilities": {
                    k: round(float(p), 6) for k, p in zip(classifier.labels, output, strict=True)
                },
            }
