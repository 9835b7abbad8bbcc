"""`serve`: a real uvicorn server on a free port, a real HTTP client, the session's tiny model."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httpx
import pytest

from schemas.http_api import SentimentResponse
from tests.integration.helpers import SAMPLES
from tests.integration.serve_helpers import SlowClassifier, scrape, serving
from worker.config import DEFAULT_LOW_CONFIDENCE
from worker.files.predict import predict_lines
from worker.labelling.labeller import Labeller

API = "/v1/sentiment"
TEXTS = [json.loads(line)["text"] for line in SAMPLES.read_text(encoding="utf-8").splitlines()]


async def post_all(url: str, bodies: list[Any]) -> list[httpx.Response]:
    """Every body POSTed at once, each on its own connection."""
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        return list(await asyncio.gather(*(client.post(API, json=body) for body in bodies)))


def test_concurrent_requests_share_batches_and_come_back_in_request_order(tiny_classifier: Any) -> None:
    # Request i carries 1-3 reviews with its own ids; 24 requests arrive together.
    bodies = []
    for i in range(24):
        texts = [TEXTS[(i * 3 + k) % len(TEXTS)] for k in range(1 + i % 3)]
        bodies.append({"texts": texts, "ids": [f"req{i}-{k}" for k in range(len(texts))]})
    expected = {
        row["text"]: row for row in predict_lines(Labeller.of(tiny_classifier), TEXTS)
    }  # what `predict` prints for them
    with serving(tiny_classifier, http_max_wait_ms=300, max_batch_size=32) as served:
        responses = asyncio.run(post_all(served.url, bodies))
        metrics = scrape(served.url)

    assert [r.status_code for r in responses] == [200] * 24
    shared = 0
    answered: list[Any] = []
    for body, response in zip(bodies, responses, strict=True):
        answer = SentimentResponse.model_validate(response.json())
        answered += answer.results
        assert [r.id for r in answer.results] == body["ids"]  # request order, ids echoed
        for text, result in zip(body["texts"], answer.results, strict=True):
            want = expected[text]
            assert (result.label, result.label_id) == (want["label"], want["label_id"])
            assert result.probabilities == pytest.approx(want["probabilities"], abs=1e-4)
            assert result.confidence == pytest.approx(want["confidence"], abs=1e-4)
        assert answer.model.name == tiny_classifier.name and answer.model.version == tiny_classifier.version
        shared += answer.timing.batch_texts > len(body["texts"])
    assert shared >= 12, "most requests should have shared their batch with others"
    # The model ran batches of more than one review: the batch-size histogram says so.
    batches = metrics["sentiment_batch_size_count{}"]
    singles = metrics["sentiment_batch_size_bucket{le=1.0}"]
    assert batches - singles >= 1 and batches < 24
    assert metrics["sentiment_batch_size_sum{}"] == sum(len(b["texts"]) for b in bodies)
    assert metrics["sentiment_http_requests_total{code=200}"] == 24
    assert metrics["sentiment_http_queued_texts{}"] == 0
    # Model monitoring counts the HTTP answers as the Kafka worker counts its results.
    version = tiny_classifier.version
    for label in tiny_classifier.labels:
        count = sum(1 for r in answered if r.label == label)
        assert metrics[f"sentiment_predictions_total{{label={label},model_version={version}}}"] == count
    low = sum(1 for r in answered if r.confidence is not None and r.confidence < DEFAULT_LOW_CONFIDENCE)
    assert metrics[f"sentiment_low_confidence_predictions_total{{model_version={version}}}"] == low
    assert metrics["sentiment_prediction_confidence_count{}"] == len(answered)


def test_one_text_and_the_openapi_document(tiny_classifier: Any) -> None:
    with serving(tiny_classifier) as served:
        one = httpx.post(served.url + API, json={"text": TEXTS[0], "id": 42})
        openapi = httpx.get(served.url + "/openapi.json").json()
        docs = httpx.get(served.url + "/docs")
        health = httpx.get(served.url + "/healthz")
        get = httpx.get(served.url + API)
    assert one.status_code == 200
    result = one.json()["results"]
    assert len(result) == 1 and result[0]["id"] == "42"
    assert result[0]["label"] == next(predict_lines(Labeller.of(tiny_classifier), TEXTS[:1]))["label"]
    operation = openapi["paths"][API]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/SentimentRequest"
    )
    assert operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/SentimentResponse"
    )
    assert {"413", "415", "422", "503", "504"} <= set(operation["responses"])
    assert operation["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ErrorResponse"
    )
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert get.status_code == 405  # the route is POST only
    assert get.json() == {
        "error": "method_not_allowed",
        "reason": "Method Not Allowed",
    }  # not {"detail": ...}
    assert get.headers["allow"] == "POST"


ORIGIN = "https://reviews.example"
SMALL_LIMITS = {"http_max_texts": 8, "http_max_body_bytes": 8192, "max_text_chars": 200}


@pytest.fixture(scope="module")
def served_small(tiny_classifier: Any) -> Any:
    """One server with small limits for the bad-input cases."""
    with serving(tiny_classifier, **SMALL_LIMITS) as served:
        yield served.url


@pytest.fixture(scope="module")
def served_small_with_cors(tiny_classifier: Any) -> Any:
    """The same limits with CORS on (the CORS middleware is the outermost: it adds its headers to every
    answer, the route's and the guard's refusals included)."""
    with serving(tiny_classifier, http_cors_origins=[ORIGIN], **SMALL_LIMITS) as served:
        yield served.url


DEEP = b"[" * 990 + b"]" * 990  # past the JSON parser's recursion limit; json.loads raised RecursionError


@pytest.mark.parametrize(
    ("body", "status", "error", "reason"),
    [
        (b'{"text": "\xe5\xa5\xbd', 422, "invalid_request", "malformed JSON"),
        (b"", 422, "invalid_request", "the body is empty"),
        (b"{}", 422, "invalid_request", "give either `text`"),
        (b'{"text": ""}', 422, "invalid_request", "text: String should have at least 1 character"),
        (b'{"text": "   "}', 422, "invalid_request", "no visible character"),
        (b'{"text": 5}', 422, "invalid_request", "text: Input should be a valid string"),
        (b'{"texts": []}', 422, "invalid_request", "texts: List should have at least 1 item"),
        (b'{"texts": ["ok", 3]}', 422, "invalid_request", "texts.1: Input should be a valid string"),
        (b'{"texts": ["ok", 3], "ids": ["a"]}', 422, "invalid_request", "texts.1: Input should be a valid"),
        (b'{"texts": ["a", "b"], "ids": ["x"]}', 422, "invalid_request", "`ids` has 1 entries for 2 texts"),
        (b'{"text": "ok", "texts": ["ok"]}', 422, "invalid_request", "either `text`"),
        (b'["ok"]', 422, "invalid_request", "Input should be an object"),
        (b"null", 422, "invalid_request", "Input should be an object"),
        # Hostile JSON: a clear 422, no 500.
        (b'{"text": "ok", "m": ' + DEEP + b"}", 422, "invalid_request", "malformed JSON: recursion limit"),
        (DEEP, 422, "invalid_request", "nested too deeply"),
        (b'{"text": "ok", "id": ' + b"7" * 4301 + b"}", 422, "invalid_request", "send an id this long as"),
        (b'{"text": "ok", "id": "\\ud800"}', 422, "invalid_request", "surrogate (\\ud800-\\udfff) its pair"),
        (b'{"texts": ["ok"], "ids": ["\\udc00"]}', 422, "invalid_request", "malformed JSON: lone"),
        (
            json.dumps({"text": "好" * 201}).encode(),
            422,
            "text_too_long",
            "201 characters, more than the limit of 200",
        ),
        (json.dumps({"texts": ["好"] * 9}).encode(), 413, "too_many_texts", "9 texts; at most 8"),
        (json.dumps({"text": "好" * 2000}).encode(), 413, "body_too_large", "larger than 8192 bytes"),
        (json.dumps({"texts": ["很好", "太差了"], "ids": ["a", "b"]}).encode(), 200, None, None),
        (b'{"text": "ok", "id": ' + b"7" * 4300 + b"}", 200, None, None),  # as long as an int may be
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_body_gets_its_status_and_reason_with_cors_on_or_off(
    served_small: str,
    served_small_with_cors: str,
    body: bytes,
    status: int,
    error: str | None,
    reason: str | None,
) -> None:
    headers = {"Content-Type": "application/json", "Origin": ORIGIN}
    with_cors = httpx.post(served_small_with_cors + API, content=body, headers=headers)
    without = httpx.post(served_small + API, content=body, headers=headers)
    assert with_cors.status_code == without.status_code == status, without.text
    answers = [with_cors.json(), without.json()]
    if status == 200:  # timings differ; the results and the model do not
        for answer in answers:
            answer.pop("timing")
        sent = json.loads(body)
        assert [r["id"] for r in answers[0]["results"]] == sent.get("ids", [str(sent.get("id"))])
    else:
        assert set(answers[0]) == {"error", "reason"} and answers[0]["error"] == error
        assert reason is not None and reason in answers[0]["reason"]
    assert answers[0] == answers[1]
    # CORS on: the browser may read the answer; off: no CORS header at all
    assert with_cors.headers.get("access-control-allow-origin") == ORIGIN
    assert "access-control-allow-origin" not in without.headers


def test_a_bad_text_in_a_batch_gets_its_own_error_and_the_others_their_labels(
    served_small: str, tiny_classifier: Any
) -> None:
    """The one rule for odd texts, per item: a blank, an invisible-only and an over-long text each get their
    error, the good ones the labels `predict` gives them; a batch of only bad texts is answered too."""
    texts = [TEXTS[0], "   ", "\u200b\u200d", "好" * 201, TEXTS[1]]
    answer = httpx.post(served_small + API, json={"texts": texts, "ids": ["a", "b", "c", "d", "e"]})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [(r["id"], (r["error"] or {}).get("kind")) for r in results] == [
        ("a", None),
        ("b", "empty_text"),
        ("c", "empty_text"),
        ("d", "text_too_long"),
        ("e", None),
    ]
    expected = [row["label"] for row in predict_lines(Labeller.of(tiny_classifier), [TEXTS[0], TEXTS[1]])]
    assert [results[0]["label"], results[4]["label"]] == expected
    assert results[1]["label"] is None and "no visible character" in results[1]["error"]["reason"]
    only_bad = httpx.post(served_small + API, json={"texts": ["", " "]})
    assert only_bad.status_code == 200, only_bad.text
    assert [r["error"]["kind"] for r in only_bad.json()["results"]] == ["empty_text", "empty_text"]
    assert only_bad.json()["timing"]["batch_texts"] == 0


def test_with_cors_the_guards_refusals_are_readable_and_a_preflight_needs_no_token(
    tiny_classifier: Any,
) -> None:
    secret = "s3cret-token-cors"
    origin = {"Origin": ORIGIN}
    with serving(tiny_classifier, api_token=secret, http_cors_origins=[ORIGIN], **SMALL_LIMITS) as served:
        preflight = httpx.options(
            served.url + API,
            headers={
                **origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        missing = httpx.post(served.url + API, json={"text": TEXTS[0]}, headers=origin)
        auth = {**origin, "Authorization": f"Bearer {secret}"}
        not_json = httpx.post(
            served.url + API, content=b"text", headers={**auth, "Content-Type": "text/plain"}
        )
        too_large = httpx.post(served.url + API, json={"text": "好" * 5000}, headers=auth)
        right = httpx.post(served.url + API, json={"text": TEXTS[0]}, headers=auth)
        other_origin = httpx.post(
            served.url + API, json={"text": TEXTS[0]}, headers={**auth, "Origin": "https://elsewhere.example"}
        )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    answers = [missing, not_json, too_large, right]
    assert [a.status_code for a in answers] == [401, 415, 413, 200]
    assert [a.json().get("error") for a in answers[:3]] == [
        "unauthorized",
        "unsupported_media_type",
        "body_too_large",
    ]
    assert all(a.headers.get("access-control-allow-origin") == ORIGIN for a in answers)
    assert (
        other_origin.status_code == 200
    )  # CORS is the browser's rule: the server answers, without the header
    assert "access-control-allow-origin" not in other_origin.headers


def test_a_body_that_is_not_utf8_is_malformed_json(served_small: str) -> None:
    response = httpx.post(
        served_small + API, content=b'{"text": "\xff"}', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_request" and "malformed JSON" in response.json()["reason"]


@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", "text/plain", None],  # curl -d, a text upload, no header at all
    ids=["form", "text", "none"],
)
def test_a_body_not_sent_as_json_is_told_which_header_to_send(
    served_small: str, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type is not None else {}
    response = httpx.post(served_small + API, content=b'{"text": "\xe5\xa5\xbd"}', headers=headers)
    assert response.status_code == 415, response.text
    answer = response.json()
    assert set(answer) == {"error", "reason"} and answer["error"] == "unsupported_media_type"
    assert (f"sent as {content_type}:" if content_type else "sent with no Content-Type:") in answer["reason"]
    assert "send the header `Content-Type: application/json`" in answer["reason"]
    assert "valid dictionary" not in answer["reason"]


def test_json_content_types_with_parameters_or_a_json_suffix_are_json(served_small: str) -> None:
    for content_type in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"):
        response = httpx.post(served_small + API, json={"text": "好"}, headers={"Content-Type": content_type})
        assert response.status_code == 200, (content_type, response.text)


def test_a_streamed_body_over_the_limit_is_refused_too(served_small: str) -> None:
    def chunks() -> Any:
        yield b'{"texts": ['
        for _ in range(100):
            yield json.dumps("好" * 30).encode() + b","
        yield b'"end"]}'

    response = httpx.post(served_small + API, content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"] == "body_too_large"


def test_the_bearer_token_is_enforced_and_never_shown(
    tiny_classifier: Any, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cret-token-7f1c"
    caplog.set_level(logging.DEBUG)
    with serving(tiny_classifier, api_token=secret) as served:
        missing = httpx.post(served.url + API, json={"text": TEXTS[0]})
        wrong = httpx.post(
            served.url + API, json={"text": TEXTS[0]}, headers={"Authorization": "Bearer nope"}
        )
        # Refused before the body is read: malformed JSON without the token is still 401.
        unparsed = httpx.post(served.url + API, content=b"{", headers={"Content-Type": "application/json"})
        right = httpx.post(
            served.url + API, json={"text": TEXTS[0]}, headers={"Authorization": f"Bearer {secret}"}
        )
        page = httpx.get(served.url + "/")
        metrics = httpx.get(served.url + "/metrics").text
        bearer = {"Authorization": f"Bearer {secret}"}
        openapi = httpx.get(served.url + "/openapi.json", headers=bearer)
        openapi_without = httpx.get(served.url + "/openapi.json")
        docs = [httpx.get(served.url + path, headers=bearer) for path in ("/docs", "/redoc")]
        probes = [httpx.get(served.url + path).status_code for path in ("/healthz", "/readyz")]
    assert [missing.status_code, wrong.status_code, unparsed.status_code] == [401, 401, 401]
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert missing.json()["error"] == "unauthorized"
    assert right.status_code == 200 and len(right.json()["results"]) == 1
    # The page is open and self-contained (no script from elsewhere); it asks for the token.
    assert page.status_code == 200 and "<script src" not in page.text
    assert probes == [200, 200]
    # The API's description is for token holders; the CDN-scripted /docs and /redoc are off.
    assert openapi.status_code == 200 and "HTTPBearer" in openapi.text  # documented
    assert openapi_without.status_code == 401 and openapi_without.json()["error"] == "unauthorized"
    assert [r.status_code for r in docs] == [404, 404]
    for text in (metrics, openapi.text, caplog.text):
        assert secret not in text
    assert 'sentiment_http_requests_total{code="401"} 3.0' in metrics  # /v1/ answers only


def test_overload_answers_503_with_retry_after_and_nothing_is_lost(tiny_classifier: Any) -> None:
    slow = SlowClassifier(tiny_classifier, delay_s=0.25)
    bodies = [{"texts": TEXTS[i % 20 : i % 20 + 4]} for i in range(40)]
    with serving(slow, http_max_texts=4, http_max_queued_texts=12, max_batch_size=8) as served:
        responses = asyncio.run(post_all(served.url, bodies))
        after = httpx.post(served.url + API, json={"texts": TEXTS[:4]})
        metrics = scrape(served.url)
    codes = [r.status_code for r in responses]
    assert set(codes) == {200, 503}, codes  # every request answered: a result or a refusal
    refused = [r for r in responses if r.status_code == 503]
    assert all(r.headers["Retry-After"] == "1" and r.json()["error"] == "overloaded" for r in refused)
    for body, response in zip(bodies, responses, strict=True):
        if response.status_code == 200:
            assert len(response.json()["results"]) == len(body["texts"])
    assert after.status_code == 200  # recovered once the queue drained
    assert metrics["sentiment_http_requests_total{code=503}"] == len(refused)
    assert metrics["sentiment_http_requests_total{code=200}"] == codes.count(200) + 1
    assert metrics["sentiment_http_queued_texts{}"] == 0


def test_a_request_not_answered_in_time_gets_504(tiny_classifier: Any) -> None:
    slow = SlowClassifier(tiny_classifier, delay_s=1.0)
    with serving(slow, http_request_timeout_s=0.3) as served:
        response = httpx.post(served.url + API, json={"text": TEXTS[0]})
    assert response.status_code == 504
    assert response.json() == {"error": "timeout", "reason": "not labelled within 0.3 s"}


def accepted_texts(served: Any) -> float:
    """Texts accepted by the admission: still waiting (the gauge) or already answered (the counter; counted
    after the gauge is lowered, so the sum never counts a text twice)."""
    registry = served.registry
    waiting = registry.get_sample_value("sentiment_http_queued_texts") or 0.0
    return waiting + (registry.get_sample_value("sentiment_http_texts_total") or 0.0)


def test_stopping_answers_every_accepted_request(tiny_classifier: Any) -> None:
    slow = SlowClassifier(tiny_classifier, delay_s=0.3)
    bodies = [{"texts": [TEXTS[i]]} for i in range(6)]

    async def stop_while_busy(url: str, served: Any) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            tasks = [asyncio.create_task(client.post(API, json=b)) for b in bodies]
            # Every request accepted (waiting or already answered) before the stop, polled with a deadline.
            deadline = time.monotonic() + 30
            while accepted_texts(served) < len(bodies):
                assert time.monotonic() < deadline, f"only {accepted_texts(served)} texts accepted after 30 s"
                await asyncio.sleep(0.01)
            served.service.request_stop()
            return list(await asyncio.gather(*tasks))

    with serving(slow, http_max_wait_ms=0, max_batch_size=1) as served:
        responses = asyncio.run(stop_while_busy(served.url, served))
    assert [r.status_code for r in responses] == [200] * len(bodies)
    assert [r.json()["results"][0]["label"] for r in responses] == [
        row["label"] for row in predict_lines(Labeller.of(tiny_classifier), TEXTS[:6])
    ]


def test_a_poison_request_among_good_ones_on_a_busy_model_fails_alone(tiny_classifier: Any) -> None:
    """Issue 41's mixed load: while the model is busy, five good requests and one carrying a lone surrogate
    (which the tokenizer cannot take) arrive together, three times over: every good one gets 200 with its
    labels, the poison one alone gets 422 with a reason."""
    expected = {row["text"]: row["label"] for row in predict_lines(Labeller.of(tiny_classifier), TEXTS)}
    slow = SlowClassifier(tiny_classifier, delay_s=0.2)
    poison = '{"texts": ["\\ud800"]}'
    with serving(slow, http_max_wait_ms=50) as served:

        async def round_(k: int) -> list[httpx.Response]:
            good = [{"texts": [TEXTS[(k * 5 + i) % len(TEXTS)]]} for i in range(5)]
            async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
                busy = client.post(API, json={"texts": TEXTS[:8]})  # keeps the model busy meanwhile
                calls = [client.post(API, json=body) for body in good]
                bad = client.post(API, content=poison, headers={"Content-Type": "application/json"})
                answers = await asyncio.gather(busy, *calls, bad)
            for body, answer in zip(good, answers[1:6], strict=True):
                assert answer.status_code == 200, answer.text
                assert answer.json()["results"][0]["label"] == expected[body["texts"][0]]
            return list(answers)

        for k in range(3):
            answers = asyncio.run(round_(k))
            assert answers[0].status_code == 200
            assert answers[-1].status_code == 422 and "surrogate" in answers[-1].json()["reason"]
