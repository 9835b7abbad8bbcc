"""The OpenAPI document still describes `POST /v1/sentiment` in full, although FastAPI's route for it only
documents it (`ApiGuard` answers it): the request and response models, the bearer scheme, every refusal."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from schemas.http_api import ErrorResponse, SentimentRequest, SentimentResponse
from worker.config import WorkerSettings
from worker.health import HealthState
from worker.http.api import API_PATH, ApiState, build_app
from worker.metrics import create_http_metrics


def openapi(**settings: Any) -> dict[str, Any]:
    registry = CollectorRegistry()
    s = WorkerSettings(**settings).sections
    api = ApiState(s.http, s.limits, registry, HealthState(30, kafka=False), create_http_metrics(registry))
    return build_app(api).openapi()


def schema_of(document: dict[str, Any], content: dict[str, Any]) -> dict[str, Any]:
    ref = content["application/json"]["schema"]["$ref"]
    return document["components"]["schemas"][ref.rsplit("/", 1)[1]]  # type: ignore[no-any-return]


def test_the_route_documents_its_models_and_every_refusal() -> None:
    document = openapi(api_token="s3cret")
    operation = document["paths"][API_PATH]["post"]
    request = schema_of(document, operation["requestBody"]["content"])
    assert operation["requestBody"]["required"] is True
    assert set(request["properties"]) == set(SentimentRequest.model_fields) == {"text", "id", "texts", "ids"}
    responses = operation["responses"]
    assert set(schema_of(document, responses["200"]["content"])["properties"]) == set(
        SentimentResponse.model_fields
    )
    assert set(responses) == {"200", "401", "413", "415", "422", "503", "504"}
    for status in ("401", "413", "415", "422", "503", "504"):
        refusal = schema_of(document, responses[status]["content"])
        assert set(refusal["properties"]) == set(ErrorResponse.model_fields) == {"error", "reason"}, status
        assert responses[status]["description"], status
    assert "HTTPValidationError" not in document["components"]["schemas"]  # FastAPI's 422 is not ours
    assert operation["security"] == [{"HTTPBearer": []}]
    assert "HTTPBearer" in document["components"]["securitySchemes"]


def test_without_a_token_no_bearer_scheme_is_documented() -> None:
    document = openapi()
    assert "security" not in document["paths"][API_PATH]["post"]
    assert set(document["paths"]) == {API_PATH, "/healthz", "/readyz"}
