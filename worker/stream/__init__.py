"""The run path: consume → decode → consume window → batch plan → inference thread → records → publish →
offsets. `app.SentimentWorker` is the one place that wires these stages and owns their lifecycle; the window,
the batch plan, the labelling and the inference thread are the engine's (`worker.inference`).

Modules, in the order a message meets them: `consumer` (group member, rebalances, commits), `decode`
(bytes → review or dead-letter reason), `windows` (a window's records in input order), `records` and
`producer` (results, dead letters, delivery acks), `offsets` and `partitions` (what may be committed,
per-partition bookkeeping), `backpressure`, `lag_clock`, `startup` (Kafka clients, topics, transactions).
Health and metrics are `worker.health` and `worker.metrics`, shared with the HTTP serving.

The HTTP serving of the same model: `request_batcher` (requests into the same window, batch plan and
inference thread), `http_api` (the FastAPI app and the page, `page.html`), `http_server` (uvicorn in a
thread) and `serving` (`sentiment-worker serve`, and the API on the worker's own port).
"""

from worker.stream.app import RunSummary, SentimentWorker
from worker.stream.partitions import PartitionBook, PartitionKey

__all__ = [
    "PartitionBook",
    "PartitionKey",
    "RunSummary",
    "SentimentWorker",
]
