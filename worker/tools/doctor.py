"""`doctor`: checks of everything the worker needs, each with a verdict and what to do about it."""

from __future__ import annotations

import difflib
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

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
from worker.tools.broker_probe import check_broker
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


def run_checks(settings: WorkerSettings, bootstrap_origin: str | None = None) -> list[Check]:
    """Runs every check in order; never raises. Secrets never appear in the details. `bootstrap_origin`:
    where the bootstrap address came from (`worker.config.setting_origin`), said before the broker's
    answer so that an answer from the wrong cluster shows."""
    s = settings.sections
    checks = [_check_python(), _check_cpu(), _check_paddle()]
    device_check, device = _check_device(s.model)
    checks.append(device_check)
    if device is not None:
        checks.append(_check_model(s.model, s.batching, device))
    if bootstrap_origin is not None:
        checks.append(bootstrap_check(s.kafka.bootstrap_servers, bootstrap_origin))
    kafka = kafka_checks(s.kafka, s.security)
    checks.extend(kafka)
    if kafka[-1].name == "tls" and kafka[-1].verdict == "FAIL":
        return checks  # the broker check would only fail again, less clearly
    if s.registry.schema_registry_url:
        checks.extend(check_registry(s.registry, s.kafka))
    return checks


def bootstrap_check(bootstrap: str, origin: str) -> Check:
    """The address the Kafka checks use and where it came from; WARN when it is the default while a
    SENTIMENT_* variable that is no setting looks like SENTIMENT_BOOTSTRAP_SERVERS (a typo: the broker
    that answers below is then likely not the cluster meant)."""
    detail = f"{bootstrap} (from {origin})"
    if origin.startswith("the default"):
        typos = [
            name
            for name in os.environ
            if name.upper() != "SENTIMENT_BOOTSTRAP_SERVERS"
            and name.upper() not in _SETTING_VARIABLES
            and difflib.get_close_matches(name.upper(), ["SENTIMENT_BOOTSTRAP_SERVERS"], n=1, cutoff=0.8)
        ]
        if typos:
            fix = f"rename {typos[0]} to SENTIMENT_BOOTSTRAP_SERVERS; the answers below are from {bootstrap}"
            return Check("bootstrap", "WARN", f"{detail}, while {typos[0]} is set and ignored", fix)
    return Check("bootstrap", "OK", detail)


_SETTING_VARIABLES = frozenset(f"SENTIMENT_{name.upper()}" for name in WorkerSettings.model_fields)


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
