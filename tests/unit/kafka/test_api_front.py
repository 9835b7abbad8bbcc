"""The worker's HTTP API is handed in (`api=`), since the run path does not import the HTTP serving: with
`http_api` on and a port, a worker built without it is refused at once instead of quietly serving probes
only."""

from __future__ import annotations

import pytest

from schemas.sentiment_result import ModelRef
from tests.labellers import labeller_for
from worker.config import WorkerSettings
from worker.kafka.app import SentimentWorker

MODEL = ModelRef(name="tiny", version="1")


def test_http_api_without_the_api_is_refused() -> None:
    settings = WorkerSettings(http_api=True, http_port=8080)
    with pytest.raises(ValueError, match="http_api"):
        SentimentWorker(settings.sections, labeller_for(object(), settings, MODEL))


def test_no_api_is_needed_without_http_api_or_without_a_port() -> None:
    SentimentWorker(
        WorkerSettings(http_api=False, http_port=8080).sections,
        labeller_for(object(), WorkerSettings(http_api=False, http_port=8080), MODEL),
    )
    SentimentWorker(
        WorkerSettings(http_api=True, http_port=0).sections,
        labeller_for(object(), WorkerSettings(http_api=True, http_port=0), MODEL),
    )
