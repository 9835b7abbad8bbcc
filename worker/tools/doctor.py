"""`doctor`: checks of everything the worker needs, each with a verdict and what to do about it."""

from __future__ import annotations

import logging
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.config import (
    DEFAULT_MODEL_DIR,
    BatchingSettings,
    KafkaSettings,
    ModelSettings,
    SecuritySettings,
    WorkerSettings,
    kafka_extra_overrides,
    librdkafka_common,
)
from worker.inference.label_fields import label_fields
from worker.model.backend_choice import compression_outlook, cpu_description, cpu_features
from worker.model.device import DeviceChoice, DeviceUnavailableError, activate, choose_device
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier
from worker.tools.checks import Check, Verdict
from worker.tools.registry_checks import check_registry
from worker.tools.tls import handshake, uses_tls
from worker.tools.topics import check_worker_topics

MODEL_FIX = (
    f"run `make model` (it derives the default, {DEFAULT_MODEL_DIR}, from the shipped models/default; paths "
    "are relative to the repository root), or point SENTIMENT_MODEL at another model directory "
    "(`sentiment-worker train --output-dir DIR`)"
)
PADDLE_FIX = "run `make install` (paddlepaddle and paddlenlp into .venv)"
BROKER_FIX = "start a broker (`make kafka-up`) or set SENTIMENT_BOOTSTRAP_SERVERS to one that runs"
CREDENTIALS_FIX = "check SENTIMENT_SASL_USERNAME, SENTIMENT_SASL_PASSWORD and SENTIMENT_SASL_MECHANISM"
TLS_FIX = "check SENTIMENT_SECURITY_PROTOCOL against the broker's listener (and the ssl.* settings)"


def run_checks(settings: WorkerSettings) -> list[Check]:
    """Runs every check in order; never raises. Secrets never appear in the details."""
    s = settings.sections
    checks = [_check_python(), _check_cpu(), _check_paddle()]
    device_check, device = _check_device(s.model)
    checks.append(device_check)
    if device is not None:
        checks.append(_check_model(s.model, s.batching, device))
    kafka = kafka_checks(s.kafka, s.security)
    checks.extend(kafka)
    if kafka[-1].name == "tls" and kafka[-1].verdict == "FAIL":
        return checks  # the broker check would only fail again, less clearly
    if s.registry.schema_registry_url:
        checks.extend(check_registry(s.registry, s.kafka))
    return checks


def kafka_checks(kafka: KafkaSettings, security: SecuritySettings) -> list[Check]:
    """The Kafka checks of the configuration librdkafka gets (kafka_extra's overrides included, named in a
    WARN first): the TLS handshake (SSL/SASL_SSL), then the broker and the topics; the TLS check last when
    it fails. Never raises."""
    checks = []
    overrides = kafka_extra_overrides(kafka.kafka_extra)
    if overrides:
        checks.append(
            Check(
                "kafka_extra",
                "WARN",
                f"SENTIMENT_KAFKA_EXTRA overrides {', '.join(overrides)}: the checks below use the "
                "configuration the Kafka clients get",
                "set the settings of the same meaning instead (docs/security.md)",
            )
        )
    if uses_tls(librdkafka_common(kafka, security)):
        tls = check_tls(kafka, security)
        checks.append(tls)
        if tls.verdict == "FAIL":
            return checks
    broker = check_broker(kafka, security)
    checks.append(broker)
    if broker.verdict == "OK":
        checks.extend(_check_topics(kafka, security))
    return checks


def _guard(name: str, body: Callable[[], Check]) -> Check:
    try:
        return body()
    except Exception as exc:  # noqa: BLE001 - a check reports, never crashes the report
        return Check(name, "FAIL", f"{type(exc).__name__}: {exc}")


def _check_python() -> Check:
    return Check("python", "OK", f"{platform.python_version()} on {platform.machine()} {platform.system()}")


def _check_cpu() -> Check:
    return Check("cpu", "OK", f"{cpu_description()} → {compression_outlook(cpu_features())}")


def _check_paddle() -> Check:
    def body() -> Check:
        import paddle
        import paddlenlp

        cuda = paddle.device.is_compiled_with_cuda()
        build = f"CUDA {paddle.version.cuda()}" if cuda else "CPU-only build"
        return Check(
            "paddle", "OK", f"paddlepaddle {paddle.__version__} ({build}), paddlenlp {paddlenlp.__version__}"
        )

    check = _guard("paddle", body)
    return check if check.verdict == "OK" else Check("paddle", "FAIL", check.detail, PADDLE_FIX)


def _check_device(model: ModelSettings) -> tuple[Check, object | None]:
    try:
        choice = choose_device(model.device)
    except DeviceUnavailableError as exc:
        return Check(f"device={model.device}", "FAIL", str(exc)), None
    except Exception as exc:  # noqa: BLE001
        detail = f"{type(exc).__name__}: {exc}"
        return Check(f"device={model.device}", "FAIL", detail, "set SENTIMENT_DEVICE=cpu"), None
    return Check(f"device={model.device}", "OK", f"{choice.paddle_device} ({choice.reason})"), choice


def _check_model(model: ModelSettings, batching: BatchingSettings, device: object) -> Check:
    def body() -> Check:
        assert isinstance(device, DeviceChoice)
        activate(device)
        started = time.perf_counter()
        try:
            options = InferenceOptions.from_settings(model, batching)
            limit = model.max_seq_len
            classifier = load_classifier(model.model, device, max_seq_len=limit, options=options)
        except ModelLoadError as exc:
            # The loader's message says what to do about a directory that exists (or a hub name).
            path = Path(model.model).expanduser()
            if not path.exists() and ("/" in model.model or model.model.startswith((".", "~"))):
                return Check("model", "FAIL", f"model directory {path} does not exist", MODEL_FIX)
            return Check("model", "FAIL", str(exc))
        probs = classifier.predict_texts(["质量很好，非常满意", "太差了，再也不买"])
        labels = [label_fields(row, classifier.labels)["label"] for row in probs]
        seconds = time.perf_counter() - started
        content = f"content sha256 {classifier.content_hash}" if classifier.content_hash else "a hub model"
        detail = (
            f"{classifier.name} {classifier.version} ({getattr(classifier, 'backend', 'dynamic')} backend, "
            f"{content}) ran in {seconds:.1f} s; samples: {labels}"
        )
        return Check("model", "OK", detail)

    return _guard("model", body)


def check_tls(kafka: KafkaSettings, security: SecuritySettings) -> Check:
    """SSL/SASL_SSL: a TLS handshake with the first bootstrap server; what is wrong, in one line (WARN: it
    worked only because the configuration turns the broker's certificate check off)."""
    outcome = handshake(kafka, security)
    verdict: Verdict = "FAIL" if not outcome.ok else "WARN" if outcome.unverified else "OK"
    return Check("tls", verdict, outcome.detail, outcome.fix if verdict != "OK" else None)


def check_broker(kafka: KafkaSettings, security: SecuritySettings) -> Check:
    """Reads cluster metadata once. librdkafka's own log lines of the attempt (one per retry, on stderr by
    default) are kept out of the report; the last error among them says why, and picks the fix."""
    from confluent_kafka.admin import AdminClient

    collected = _LogLines()
    logger = logging.Logger("doctor.librdkafka")  # not registered: this probe's lines only
    logger.addHandler(collected)
    timeout_s = 5.0
    conf: dict[str, Any] = {**librdkafka_common(kafka, security), "logger": logger}
    bootstrap = conf.get("bootstrap.servers") or conf.get("metadata.broker.list")
    try:
        admin = AdminClient(conf)
    except Exception as exc:  # noqa: BLE001 - a check reports, never crashes the report
        detail = f"the client refused its settings ({type(exc).__name__}: {exc})"
        return Check(
            "broker", "FAIL", detail, "check SENTIMENT_KAFKA_EXTRA and the SENTIMENT_SASL_* settings"
        )
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001
        admin.poll(0)  # hands the queued log lines to `logger`
        cause = collected.last_error() or f"{type(exc).__name__}: {exc}"
        detail = f"{bootstrap} did not answer within {timeout_s:g} s ({cause})"
        return Check("broker", "FAIL", detail, broker_fix(collected.messages))
    brokers = ", ".join(f"{b.host}:{b.port}" for b in metadata.brokers.values())
    return Check("broker", "OK", f"{bootstrap} answered; brokers: {brokers}")


class _LogLines(logging.Handler):
    """librdkafka's log lines (`FAIL [rdkafka#producer-1] [thrd:...]: <what happened>`), kept, not shown."""

    _PREFIX = re.compile(r"^\S+ \[[^\]]*\] \[thrd:[^\]]*\]: ")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append((record.levelno, self._PREFIX.sub("", record.getMessage())))

    def last_error(self) -> str | None:
        errors = [message for level, message in self.messages if level >= logging.WARNING]
        return errors[-1] if errors else None


def broker_fix(messages: list[tuple[int, str]]) -> str:
    """What fixes a broker that did not answer, from librdkafka's log lines: credentials when it refused
    the login, the security protocol when TLS failed, else a broker at the bootstrap address."""
    text = " ".join(message for _, message in messages)
    if "SASL" in text or "Authentication" in text:
        return CREDENTIALS_FIX
    if "SSL" in text:
        return TLS_FIX
    return BROKER_FIX


def _check_topics(kafka: KafkaSettings, security: SecuritySettings) -> list[Check]:
    """Every start-up check `run` makes on the topics (`worker.kafka.topic_checks`): a check `run` refuses
    on is a FAIL, one it starts with a warning a WARN."""
    try:
        findings = check_worker_topics(librdkafka_common(kafka, security), kafka)
    except Exception as exc:  # noqa: BLE001
        fix = "check the broker (`make kafka-status`) and that this principal may describe topics"
        return [Check("topics", "FAIL", f"{type(exc).__name__}: {exc}", fix)]
    checks = []
    for finding in findings:
        verdict: Verdict = (
            "FAIL" if finding.severity == "refuse" else "WARN" if finding.severity == "warn" else "OK"
        )
        if finding.check == "exists":
            fix = f"run `sentiment-worker topics create --bootstrap-servers {kafka.bootstrap_servers}`"
            checks.append(
                Check(f"topic {finding.topic}", verdict, finding.detail, fix if verdict != "OK" else None)
            )
        else:
            checks.append(
                Check(f"topic {finding.topic} {finding.check}", verdict, finding.detail, finding.fix)
            )
    return checks
