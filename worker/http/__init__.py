"""The HTTP serving of the model (`sentiment-worker serve`, and `run` with http_api), through the same
engine as the Kafka worker (`worker.inference`); it never imports the run path (`worker.kafka`), nor the
run path it.

Modules: `admission` (requests admitted to the engine, bounded), `api` (the FastAPI app and the
page, `page.html`; `ApiGuard`, the one route of `POST /v1/sentiment`), `validation` (the one validation of
its body), `server` (uvicorn in a thread), `connections` (each connection's bounds: head size, head and
body timeouts, keep-alive, how many at once) and `serving` (`serve`, and `WorkerApi`, the API on the Kafka
worker's own port).
"""

from worker.http.server import HttpServer, HttpServerError
from worker.http.serving import SentimentApi, ServeSummary, WorkerApi

__all__ = ["HttpServer", "HttpServerError", "SentimentApi", "ServeSummary", "WorkerApi"]
