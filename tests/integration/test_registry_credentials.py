"""Registry credentials given in the URL (`http://user:password@host/...`, which the client accepts) are sent
as basic auth and shown nowhere: not in a dead letter's reason, not on /readyz or in the log when the
registry cannot be reached, not by `doctor`; both forms at once is one clear line (issue 50, finding 6).

The registries: the session's real one (it ignores the credentials), and a small one of the test's own that
records the Authorization header it is sent."""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from prometheus_client import CollectorRegistry

from schemas.dead_letter import DeadLetterKind, parse_dead_letter_headers
from schemas.review_decode import DecodeFailure
from schemas.sentiment_result import ModelRef
from tests.integration.helpers import make_settings
from tests.integration.kafka_io import produce, read_topic
from tests.labellers import labeller_for
from tests.polling import wait_until
from tests.worker_commands import run_command
from worker.bench.worker_process import free_port
from worker.config import WorkerSettings
from worker.health import endpoint_answer
from worker.kafka.app import SentimentWorker
from worker.kafka.registry_decode import registry_decoder
from worker.kafka.wire_format import wire_header
from worker.tools.registry_checks import check_registry

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "S3cret-Pa55@w0rd"  # an `@` too: percent-encoded in the URL
UNKNOWN_ID = 987_654


def with_user_info(url: str, user: str = "alice", password: str = SECRET) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{parts.netloc}"))


def shown(text: str | bytes) -> bool:
    """True when the password shows in `text`, as given or percent-encoded."""
    value = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    return SECRET in value or quote(SECRET, safe="") in value


@pytest.fixture
def recording_registry() -> Iterator[tuple[str, list[str]]]:
    """A registry that holds no schema and no subject, answering as the Confluent API does; yields its URL
    and the Authorization headers it was sent."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.headers.get("Authorization", ""))
            if self.path.split("?")[0].rstrip("/").endswith("/subjects"):
                status, body = 200, []
            else:
                status, body = 404, {"error_code": 40403, "message": "Schema not found"}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_user_info_in_the_url_is_sent_as_basic_auth_and_never_shown(
    recording_registry: tuple[str, list[str]],
) -> None:
    """Before: the reason and doctor's verdict named `http://alice:S3cret-Pa55%40w0rd@127.0.0.1:...`."""
    url, seen = recording_registry
    settings = WorkerSettings(input_format="avro", schema_registry_url=with_user_info(url))
    assert settings.schema_registry_url == url and not shown(repr(settings))
    assert not shown(json.dumps(settings.public_view()))
    decoder = registry_decoder(settings.sections.registry, settings.sections.limits)
    assert decoder is not None
    failure = decoder.decode(wire_header(UNKNOWN_ID) + b"\x00", "t/0/0")
    assert isinstance(failure, DecodeFailure) and failure.kind is DeadLetterKind.UNKNOWN_SCHEMA
    assert f"Schema Registry at {url} does not hold" in failure.reason and not shown(failure.reason)
    checks = check_registry(settings.sections.registry, settings.sections.kafka)
    assert checks[0].verdict == "OK", checks
    assert checks[0].detail.startswith(f"{url} answered (basic auth as 'alice')")
    assert not any(shown(check.detail) for check in checks)
    credentials = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()
    assert seen and set(seen) == {credentials}


def test_an_unknown_schema_dead_letter_names_the_registry_without_the_password(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any, schema_registry_url: str
) -> None:
    """Any producer can write a value naming an unknown schema id: its dead letter names the registry."""
    names = topics(input_partitions=1, output_partitions=1)
    settings = make_settings(
        kafka_bootstrap, names, input_format="avro", schema_registry_url=with_user_info(schema_registry_url)
    )
    produce(kafka_bootstrap, names["reviews"], [(b"k", wire_header(UNKNOWN_ID) + b"\x02\x00")])
    worker = SentimentWorker(
        settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
    )
    summary = worker.run(max_messages=1)
    assert summary.dead_letters == 1
    [dead] = read_topic(kafka_bootstrap, names["dlq"], expected=1)
    info = parse_dead_letter_headers(dead.headers())
    assert info.kind is DeadLetterKind.UNKNOWN_SCHEMA
    assert f"Schema Registry at {schema_registry_url} does not hold" in info.reason
    assert not any(shown(value or b"") for _, value in dead.headers() or [])


def test_a_registry_that_cannot_be_reached_is_named_without_the_password_on_readyz_and_in_the_log(
    kafka_bootstrap: str, topics: Any, tiny_classifier: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """/readyz (unauthenticated) and the WARNING say why the worker waits: the URL, without user info."""
    port = free_port()  # nothing listens there
    url = f"http://127.0.0.1:{port}/apis/ccompat/v7"
    names = topics(input_partitions=1, output_partitions=1)
    settings = make_settings(
        kafka_bootstrap, names, input_format="avro", schema_registry_url=with_user_info(url)
    )
    produce(kafka_bootstrap, names["reviews"], [(b"k", wire_header(UNKNOWN_ID) + b"\x02\x00")])
    caplog.set_level(logging.INFO)
    worker = SentimentWorker(
        settings.sections, labeller_for(tiny_classifier, settings, ModelRef(name="tiny", version="1"))
    )
    runner = threading.Thread(target=worker.run, kwargs={"max_messages": 1})
    runner.start()
    try:
        wait_until(lambda: worker.health.registry_problem, 60, "the worker to find the registry away")
        answer = endpoint_answer("/readyz", CollectorRegistry(), worker.health)
    finally:
        worker.request_stop()
        runner.join(60)
    assert not runner.is_alive()
    assert answer.status == 503
    said = json.loads(answer.body)["schema_registry"]
    assert f"Schema Registry at {url} cannot be reached" in said and not shown(answer.body)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"Schema Registry at {url} cannot be reached" in line for line in warnings), warnings
    assert not shown(caplog.text)


def test_doctor_with_user_info_in_the_url_and_the_variable_says_so_in_one_line() -> None:
    """Before: a raw traceback from the registry client's constructor."""
    env = {
        **os.environ,  # without the developer's SENTIMENT_* (tests/conftest.py)
        "PYTHONPATH": str(ROOT),
        "SENTIMENT_SCHEMA_REGISTRY_URL": with_user_info("http://127.0.0.1:9/apis/ccompat/v7"),
        "SENTIMENT_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO": "bob:another-secret",
        "SENTIMENT_INPUT_FORMAT": "avro",
    }
    proc = run_command("doctor", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "SENTIMENT_SCHEMA_REGISTRY_URL carries user info" in lines[0]
    assert "SENTIMENT_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO is set too" in lines[0]
    assert not shown(proc.stderr + proc.stdout) and "another-secret" not in proc.stderr
