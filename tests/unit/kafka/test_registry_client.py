"""The decode path's registry client against a real HTTP server that misbehaves (`FakeRegistry`): a deadline
per answer, not per read; a stop request ends the wait; HTML, `{}` and a bare 404 are the registry's trouble,
not the value's; an unknown id is asked once per period; a schema the registry holds but nobody can read is
its values' dead letter; and whatever fails while decoding one value is that value's dead letter."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from schemas.dead_letter import DeadLetterKind
from schemas.review_decode import DecodeFailure
from schemas.review_input import Review
from tests.registry_fixtures import FakeRegistry
from worker.kafka.json_schema_values import JsonSchemaValues
from worker.kafka.registry_client import (
    UNKNOWN_ID_TTL_S,
    RegistryClient,
    RegistryUnavailable,
    RegistryWaitStopped,
    UnknownSchemaId,
)
from worker.kafka.registry_decode import RegistryDecoder
from worker.kafka.wire_format import wire_header

TEXT_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def _in_thread(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_an_answer_trickled_a_byte_a_second_is_given_up_at_the_deadline_for_the_whole_answer() -> None:
    """Before: the timeout was per read; a byte every 3 s held the poll loop for over 97 s."""
    with FakeRegistry() as registry:
        registry.mode, registry.trickle_s = "trickle", 0.3
        client = RegistryClient(registry.url, timeout_s=1.0)
        thread, outcome = _in_thread(lambda: client.schema(1))
        thread.join(30)  # the trickle goes on for as long as it is read: only a deadline ends the wait
        assert not thread.is_alive(), "the client still waits for the trickling answer"
    assert isinstance(outcome.get("error"), RegistryUnavailable)
    assert "did not answer within 1 s" in str(outcome["error"])


def test_a_stop_request_ends_the_wait_for_the_registry() -> None:
    stop = threading.Event()
    with FakeRegistry() as registry:
        registry.mode = "trickle"
        client = RegistryClient(registry.url, timeout_s=600, stop=stop)
        thread, outcome = _in_thread(lambda: client.schema(1))
        stop.set()
        thread.join(30)
        assert not thread.is_alive()
    assert isinstance(outcome.get("error"), RegistryWaitStopped)


@pytest.mark.parametrize(("mode", "shown"), [("html", "text/html"), ("empty", "'{}'")])
def test_an_html_page_or_an_empty_object_is_the_registrys_trouble(mode: str, shown: str) -> None:
    """Before: the HTML answer's JSONDecodeError counted as the value's fault: invalid_payload, committed."""
    with FakeRegistry() as registry:
        registry.mode = mode
        with pytest.raises(RegistryUnavailable, match="not a schema") as trouble:
            RegistryClient(registry.url, timeout_s=5).schema(1)
    assert shown in str(trouble.value) and "SENTIMENT_SCHEMA_REGISTRY_URL" in str(trouble.value)


def test_a_404_without_the_registrys_error_code_is_trouble_not_an_unknown_id() -> None:
    with FakeRegistry() as registry:  # a wrong path: the server's own 404, not the registry's 40403
        client = RegistryClient(registry.url + "/not-the-api", timeout_s=5)
        registry.schemas[1] = {"schema": "{}"}
        with pytest.raises(RegistryUnavailable, match="answered 404 .*40403.*check the URL"):
            client.schema(1)


def test_an_unknown_id_is_asked_once_per_period_not_once_per_value() -> None:
    """Before: each value of an unknown id asked the registry again (a slow 404: 0.2 values/s)."""
    with FakeRegistry() as registry:
        now = [0.0]
        client = RegistryClient(registry.url, timeout_s=5, clock=lambda: now[0])
        for _ in range(50):
            with pytest.raises(UnknownSchemaId):
                client.schema(404)
        assert registry.requests == ["/schemas/ids/404"]
        now[0] += UNKNOWN_ID_TTL_S
        with pytest.raises(UnknownSchemaId):
            client.schema(404)
        assert len(registry.requests) == 2  # asked again once the period is over


def _decoder(registry: FakeRegistry, fmt: str = "json_schema") -> RegistryDecoder:
    client = RegistryClient(registry.url, timeout_s=5)
    return RegistryDecoder(client, fmt, max_value_bytes=100_000, max_text_chars=100)


def test_a_schema_the_registry_holds_but_that_cannot_be_read_dead_letters_its_values_only() -> None:
    with FakeRegistry() as registry:
        registry.schemas[1] = {"schema": json.dumps(TEXT_SCHEMA), "schemaType": "JSON"}
        registry.schemas[2] = {"schema": '{"type": "recordz"}'}  # an Avro schema no registry should accept
        registry.schemas[3] = {"schema": json.dumps({"$ref": "#"}), "schemaType": "JSON"}
        registry.schemas[4] = {"schema": "{}", "schemaType": "JSON", "references": [{"name": "x"}]}
        decoder = _decoder(registry)
        good = decoder.decode(wire_header(1) + b'{"text": "\\u597d"}', "d")
        bad = [decoder.decode(wire_header(i) + b'{"text": "x"}', "d") for i in (2, 3, 4, 2, 3, 4)]
        assert len(registry.requests) == 4  # a schema that cannot be read is kept as such: asked once
    assert isinstance(good, Review) and good.text == "好"
    kinds = [(b.kind, b.reason) for b in bad if isinstance(b, DecodeFailure)]
    assert [kind for kind, _ in kinds] == [DeadLetterKind.INVALID_SCHEMA] * 6
    assert "not a valid Avro schema" in kinds[0][1]
    assert "loops back to itself" in kinds[1][1]
    assert "references" in kinds[2][1]


def test_any_exception_decoding_one_value_is_that_values_dead_letter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: anything outside a short list of payload errors (RecursionError, TypeError) ended the window
    and the worker, on every restart. Here a reader fails in a way nobody foresaw (a KeyError)."""

    def fails(self: JsonSchemaValues, value: bytes) -> Any:
        raise KeyError("nobody foresaw this")

    with FakeRegistry() as registry:
        registry.schemas[5] = {"schema": json.dumps(TEXT_SCHEMA), "schemaType": "JSON"}
        decoder = _decoder(registry)
        monkeypatch.setattr(JsonSchemaValues, "read", fails)
        outcome = decoder.decode(wire_header(5) + b'{"text": "x"}', "d")
    assert isinstance(outcome, DecodeFailure) and outcome.kind is DeadLetterKind.DECODE_FAILED
    assert "schema id 5" in outcome.reason and "KeyError: 'nobody foresaw this'" in outcome.reason
