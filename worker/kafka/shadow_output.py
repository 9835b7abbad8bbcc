"""What the Kafka door publishes of the shadow, best effort: its results on `shadow_topic` (the result schema,
as JSON, named by the shadow model) and the reviews it labelled differently from the primary on
`shadow_sample_topic` (rate limited), for a human to read.

These go through a producer of their own (idempotent, never transactional), so they never join the primary's
transactions nor hold a commit: a window is published and committed on the primary's results alone. A window
whose shadow is not done yet waits here, at most `MAX_PENDING` of them; past that the oldest is dropped
(counted in the log). Nothing here is needed for a result to be correct.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np
from confluent_kafka import KafkaException, Producer

from schemas.review_input import Review
from worker.config import LiveModelsSettings, Sections, librdkafka_common
from worker.inference.label_fields import label_fields
from worker.kafka.records import ResultWriter
from worker.kafka.windows import PreparedWindow
from worker.labelling.labeller import Predictions

__all__ = ["ShadowOutput"]

log = logging.getLogger(__name__)

MAX_PENDING = 16
_BURST = 10.0


class ShadowOutput:
    """Publishes the shadow's results and disagreements of the windows handed to `add` (see the module
    docstring); `publish_done()` on each loop turn sends what the shadow finished."""

    def __init__(self, sections: Sections, labels: list[str], clock: Callable[[], float] = time.monotonic):
        live = sections.live
        self._results_topic = live.shadow_topic
        self._samples_topic = live.shadow_sample_topic
        self._labels = labels
        self._writer = ResultWriter(labels)
        self._clock = clock
        self._pending: deque[tuple[PreparedWindow, Predictions]] = deque()
        self._rate = live.shadow_samples_per_s
        self._tokens = _BURST
        self._refilled_at = clock()
        self._dropped = 0
        conf = librdkafka_common(sections.kafka, sections.security)
        conf.update({"enable.idempotence": True, "linger.ms": 50})
        self._producer = Producer(conf)

    @staticmethod
    def wanted(live: LiveModelsSettings) -> bool:
        """True when a shadow topic or a sample topic is set."""
        return bool(live.shadow_topic or live.shadow_sample_topic)

    def add(self, prepared: PreparedWindow, predictions: Predictions) -> None:
        """A window the primary labelled (and published); its shadow's predictions, if any, go out when
        done."""
        if predictions.shadow is None:
            return
        self._pending.append((prepared, predictions))
        if len(self._pending) > MAX_PENDING:
            self._pending.popleft()
            self._dropped += 1
            log.warning("shadow output behind: %d windows of its results not published", self._dropped)

    def publish_done(self) -> None:
        """Sends the results and disagreements of the windows whose shadow is done, in window order."""
        while self._pending and self._pending[0][1].shadow is not None:
            shadow = self._pending[0][1].shadow
            assert shadow is not None
            if not shadow.done():
                break
            prepared, primary = self._pending.popleft()
            if shadow.exception() is None:
                self._publish(prepared, primary, shadow.result())
        self._producer.poll(0)

    def close(self, timeout_s: float) -> None:
        self._producer.flush(timeout_s)

    def _publish(self, prepared: PreparedWindow, primary: Predictions, shadow: Predictions) -> None:
        now = self._clock()
        outputs = iter(zip(primary.outputs, shadow.outputs, strict=True))
        for item, review in zip(prepared.items, prepared.decoded, strict=True):
            if not isinstance(review, Review):
                continue
            ours, theirs = next(outputs)
            if not isinstance(theirs, np.ndarray):
                continue
            try:
                if self._results_topic:
                    record = self._writer.record(
                        item, review, theirs, shadow.model, topic=self._results_topic, partition=None, now=now
                    )
                    self._producer.produce(record.topic, record.value, record.key)
                if self._samples_topic and isinstance(ours, np.ndarray):
                    self._sample(item.key, review, ours, theirs, primary, shadow, item.position)
            except (BufferError, KafkaException) as exc:
                log.warning("shadow output not sent: %s", exc)
                return

    def _sample(
        self,
        key: bytes | None,
        review: Review,
        ours: np.ndarray,
        theirs: np.ndarray,
        primary: Predictions,
        shadow: Predictions,
        source: object,
    ) -> None:
        """A disagreement, when the rate allows (a token bucket of `shadow_samples_per_s`, bursts of 10)."""
        primary_fields, shadow_fields = label_fields(ours, self._labels), label_fields(theirs, self._labels)
        if primary_fields["label"] == shadow_fields["label"] or not self._take_token():
            return
        value = {
            "id": review.id,
            "text": review.text,
            "source": dict(source._asdict()) if hasattr(source, "_asdict") else None,
            "primary": {**primary_fields, "model": primary.model.model_dump()},
            "shadow": {**shadow_fields, "model": shadow.model.model_dump()},
        }
        assert self._samples_topic is not None
        self._producer.produce(self._samples_topic, json.dumps(value, ensure_ascii=False).encode(), key)

    def _take_token(self) -> bool:
        now = self._clock()
        self._tokens = min(_BURST, self._tokens + (now - self._refilled_at) * self._rate)
        self._refilled_at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
