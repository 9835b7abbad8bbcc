"""The run path: consume → decode → consume window → batch plan → inference thread → records → publish →
offsets. `app.SentimentWorker` is the one place that wires these stages and owns their lifecycle.

Modules, in the order a message meets them: `consumer` (group member, rebalances, commits), `decode`
(bytes → review or dead-letter reason), `consume_window` (when to label), `batch_plan` (how to batch),
`inference` (the model on a window, split on failure) and `inference_thread` (that work off the poll
thread), `windows` (a window's records in input order), `records` and `producer` (results, dead letters,
delivery acks), `offsets` and `partitions` (what may be committed, per-partition bookkeeping),
`backpressure`, `lag_clock`, `health`, `metrics`, `startup`, and `tuning/` (the token-budget calibration).

The HTTP serving of the same model: `request_batcher` (requests into the same window, batch plan and
inference thread), `http_api` (the FastAPI app and the page, `page.html`), `http_server` (uvicorn in a
thread) and `serving` (`sentiment-worker serve`, and the API on the worker's own port).
"""

from worker.stream.app import RunSummary, SentimentWorker
from worker.stream.inference import Classifier, InferenceFailure, TokenBudget, label_texts
from worker.stream.partitions import PartitionBook, PartitionKey
from worker.stream.startup import StartupError

__all__ = [
    "Classifier",
    "InferenceFailure",
    "PartitionBook",
    "PartitionKey",
    "RunSummary",
    "SentimentWorker",
    "StartupError",
    "TokenBudget",
    "label_texts",
]
