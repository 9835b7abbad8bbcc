"""The design documents' HTTP handler, kept as the baseline `bench --http` measures against: `POST /predict`
with one text, tokenized, padded to 128 tokens, one model call per request (`sentiment-worker bench
--naive-server PORT`).

The padded positions are appended pad ids (attended, as in `bench`'s naive loop): the same amount of model
work as the documents' padding, not the same numbers; this handler is for timing only."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, StrictStr

from schemas.sentiment_result import ModelRef
from worker.inference.classifier import Classifier

NAIVE_PAD_TO = 128
NAIVE_PATH = "/predict"


class NaiveRequest(BaseModel):
    text: StrictStr


def build_naive_app(classifier: Classifier, model: ModelRef) -> FastAPI:
    """One text per request, padded to 128, a model call each (serialized: the model is not re-entrant)."""
    app = FastAPI(title="naive sentiment handler (baseline)")
    lock = threading.Lock()
    pad_to = min(NAIVE_PAD_TO, int(getattr(classifier, "max_seq_len", NAIVE_PAD_TO)))
    pad_id = int(getattr(classifier, "pad_id", 0))

    @app.post(NAIVE_PATH)
    def predict(request: NaiveRequest) -> dict[str, Any]:  # a plain def: FastAPI runs it in its threadpool
        ids = classifier.token_ids([request.text])[0][:pad_to]
        with lock:
            probs = classifier.predict_ids([ids + [pad_id] * (pad_to - len(ids))])[0]
        label_id = int(probs.argmax())
        return {
            "label": classifier.labels[label_id],
            "confidence": float(probs[label_id]),
            "model": model.model_dump(),
        }

    @app.get("/readyz")
    def readyz() -> dict[str, str]:
        return {"status": "ok"}

    return app
