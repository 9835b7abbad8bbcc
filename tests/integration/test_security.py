"""SASL on the real broker, and secrets that never leak.

A private launcher broker gets a SASL_PLAINTEXT listener with a SCRAM-SHA-512 (and PLAIN) user. The worker
and `doctor` connect with the credentials from SENTIMENT_SECURITY_PROTOCOL / SASL_MECHANISM /
SASL_USERNAME / SASL_PASSWORD and are refused without them or with a wrong password (non-zero exit, a
clear error). The password (random per session) is grepped for in the logs, the `doctor` output,
/metrics, /healthz, /readyz and exception text: it never appears.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.faults.harness import WorkerProcess, make_topics, produce_all, review, worker_env
from tests.integration.helpers import http_get
from tests.integration.kafka_io import read_topic, results_of
from tests.kafka_fixtures import free_port, private_broker
from tests.worker_commands import run_command
from worker.config import WorkerSettings, load_settings

pytestmark = pytest.mark.integration

USER = "sentiment-svc"


@dataclass(frozen=True)
class SaslBroker:
    plaintext: str  # for the test's own admin/produce/read calls
    sasl: str  # SASL_PLAINTEXT listener
    password: str


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslBroker]:
    data = tmp_path_factory.mktemp("sasl-broker")
    password = f"pw-{uuid.uuid4().hex}"  # unique, so a grep for it finds only real leaks
    port, controller, sasl_port = free_port(), free_port(), free_port()
    up_args = ["--port", str(port), "--controller-port", str(controller), "--sasl-port", str(sasl_port)]
    with private_broker(data, *up_args, "--sasl-user", f"{USER}:{password}", secrets=[password]):
        yield SaslBroker(f"localhost:{port}", f"localhost:{sasl_port}", password)


@pytest.fixture
def names(sasl_broker: SaslBroker) -> dict[str, str]:
    suffix = uuid.uuid4().hex[:8]
    topics = {k: f"sec-{k}-{suffix}" for k in ("reviews", "results", "dlq", "group")}
    make_topics(
        sasl_broker.plaintext,
        {topics["reviews"]: 1, topics["results"]: 1, topics["dlq"]: 1},
        dlq=topics["dlq"],
    )
    return topics


def sasl_env(
    broker: SaslBroker,
    names: dict[str, str],
    model: Path,
    *,
    mechanism: str | None,
    password: str | None,
    protocol: str | None = "SASL_PLAINTEXT",
) -> dict[str, str]:
    env = worker_env(broker.sasl, names, model, SENTIMENT_LOG_LEVEL="DEBUG")
    if protocol is not None:
        env["SENTIMENT_SECURITY_PROTOCOL"] = protocol
    if mechanism is not None:
        env["SENTIMENT_SASL_MECHANISM"] = mechanism
        env["SENTIMENT_SASL_USERNAME"] = USER
    if password is not None:
        env["SENTIMENT_SASL_PASSWORD"] = password
    return env


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_worker_with_credentials_labels_the_stream_and_never_shows_the_password(
    mechanism: str, sasl_broker: SaslBroker, names: dict[str, str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    produce_all(sasl_broker.plaintext, names["reviews"], [review(i, "sec") for i in range(30)])
    env = sasl_env(sasl_broker, names, tiny_model_dir, mechanism=mechanism, password=sasl_broker.password)
    http_port = free_port()
    env["SENTIMENT_HTTP_PORT"] = str(http_port)
    worker = WorkerProcess(env, tmp_path, "sasl-worker")
    scraped: list[str] = []
    try:
        results = results_of(read_topic(sasl_broker.plaintext, names["results"], expected=30, timeout_s=120))
        base = f"http://127.0.0.1:{http_port}"
        scraped = [http_get(base + path)[1] for path in ("/metrics", "/healthz", "/readyz")]
        worker.terminate()
        code = worker.wait(60)
    finally:
        worker.stop()
    assert code == 0, worker.stderr_tail()
    assert sorted(r["id"] for r in results) == [f"sec-{i:05d}" for i in range(30)]
    assert "sentiment_" in scraped[0]  # really the metrics page
    for where, text in [
        ("stdout", worker.stdout()),
        ("stderr", worker.stderr()),
        *zip(["/metrics", "/healthz", "/readyz"], scraped, strict=True),
    ]:
        assert sasl_broker.password not in text, f"the SASL password leaked into {where}"


@pytest.mark.parametrize(
    ("case", "protocol", "mechanism", "password"),
    [
        ("wrong password", "SASL_PLAINTEXT", "SCRAM-SHA-512", "wrong-" + uuid.uuid4().hex),
        ("plaintext client", None, None, None),
        ("SASL without mechanism or credentials", "SASL_PLAINTEXT", None, None),
    ],
    ids=["wrong-password", "plaintext-client", "sasl-without-credentials"],
)
def test_worker_without_valid_credentials_is_refused_with_a_clear_error(
    case: str,
    protocol: str | None,
    mechanism: str | None,
    password: str | None,
    sasl_broker: SaslBroker,
    names: dict[str, str],
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    produce_all(sasl_broker.plaintext, names["reviews"], [review(i, "nope") for i in range(5)])
    env = sasl_env(
        sasl_broker, names, tiny_model_dir, mechanism=mechanism, password=password, protocol=protocol
    )
    worker = WorkerProcess(env, tmp_path, "refused")
    error_line = worker.refusal_line()
    err = worker.stderr()
    if protocol is not None and mechanism is None:  # refused by the settings check, before any connection
        assert "needs sasl_mechanism" in error_line, error_line
    else:
        assert "Nothing was consumed" in error_line, error_line
    if mechanism is not None:  # librdkafka says why (the worker's own line only says the broker failed)
        assert "SASL authentication error" in err and "Authentication failed" in err, worker.stderr_tail()
    for secret in (sasl_broker.password, password):
        if secret:
            assert secret not in err + worker.stdout(), f"{case}: a password leaked into the output"
    assert read_topic(sasl_broker.plaintext, names["results"], expected=1, timeout_s=3, settle_s=0) == []


def _doctor(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_command("doctor", env=env, timeout=180)


def test_doctor_connects_with_credentials_and_fails_with_a_wrong_password_without_showing_either(
    sasl_broker: SaslBroker, names: dict[str, str], tiny_model_dir: Path
) -> None:
    good = _doctor(
        sasl_env(sasl_broker, names, tiny_model_dir, mechanism="SCRAM-SHA-512", password=sasl_broker.password)
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"[OK  ] broker: {sasl_broker.sasl} answered" in good.stdout
    assert f"[OK  ] topic {names['results']}: 1 partition" in good.stdout
    wrong_password = "wrong-" + uuid.uuid4().hex
    bad = _doctor(
        sasl_env(sasl_broker, names, tiny_model_dir, mechanism="SCRAM-SHA-512", password=wrong_password)
    )
    assert bad.returncode == 1
    assert "[FAIL] broker:" in bad.stdout, bad.stdout
    broker = next(line for line in bad.stdout.splitlines() if line.startswith("[FAIL] broker:"))
    assert "Authentication failed" in broker and "fix: check SENTIMENT_SASL_USERNAME" in broker, broker
    for run in (good, bad):
        for secret in (sasl_broker.password, wrong_password):
            assert secret not in run.stdout + run.stderr, "doctor showed a password"


def test_settings_never_show_the_password_in_repr_views_or_validation_errors(tmp_path: Path) -> None:
    secret = "pw-" + uuid.uuid4().hex
    settings = WorkerSettings(
        sasl_username=USER, sasl_password=secret, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512"
    )
    with pytest.raises(ValidationError) as incomplete:  # a SASL protocol without a mechanism
        WorkerSettings(sasl_username=USER, sasl_password=secret, security_protocol="SASL_SSL")
    assert secret not in str(incomplete.value) and "needs sasl_mechanism" in str(incomplete.value)
    assert settings.librdkafka_common()["sasl.password"] == secret  # handed to librdkafka only
    for text in (repr(settings), str(settings), json.dumps(settings.public_view())):
        assert secret not in text
    with pytest.raises(ValidationError) as invalid:
        WorkerSettings(sasl_password=secret, max_batch_size=0)
    assert secret not in str(invalid.value) and secret not in repr(invalid.value)
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"sasl_password": secret, "max_window_messages": "many"}))
    with pytest.raises(ValidationError) as from_file:
        load_settings(config)
    assert secret not in str(from_file.value)
