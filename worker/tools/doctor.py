"""`doctor`: checks of everything the worker needs, each with a verdict and what to do about it."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from worker.config import WorkerSettings
from worker.model.backend_choice import compression_outlook, cpu_description, cpu_features
from worker.model.device import DeviceChoice, DeviceUnavailableError, activate, choose_device
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier
from worker.tools.topics import describe_topics

Verdict = Literal["OK", "WARN", "FAIL"]


@dataclass(frozen=True)
class Check:
    name: str
    verdict: Verdict
    detail: str


def run_checks(settings: WorkerSettings) -> list[Check]:
    """Runs every check in order; never raises. Secrets never appear in the details."""
    checks = [_check_python(), _check_cpu(), _check_paddle()]
    device_check, device = _check_device(settings)
    checks.append(device_check)
    if device is not None:
        checks.append(_check_model(settings, device))
    broker = _check_broker(settings)
    checks.append(broker)
    if broker.verdict == "OK":
        checks.extend(_check_topics(settings))
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

    return _guard("paddle", body)


def _check_device(settings: WorkerSettings) -> tuple[Check, object | None]:
    try:
        choice = choose_device(settings.device)
    except DeviceUnavailableError as exc:
        return Check(f"device={settings.device}", "FAIL", str(exc)), None
    except Exception as exc:  # noqa: BLE001
        return Check(f"device={settings.device}", "FAIL", f"{type(exc).__name__}: {exc}"), None
    return Check(f"device={settings.device}", "OK", f"{choice.paddle_device} ({choice.reason})"), choice


def _check_model(settings: WorkerSettings, device: object) -> Check:
    def body() -> Check:
        assert isinstance(device, DeviceChoice)
        activate(device)
        started = time.perf_counter()
        try:
            options = InferenceOptions.from_settings(settings)
            limit = settings.max_seq_len
            classifier = load_classifier(settings.model, device, max_seq_len=limit, options=options)
        except ModelLoadError as exc:
            return Check("model", "FAIL", str(exc))
        probs = classifier.predict_texts(["质量很好，非常满意", "太差了，再也不买"])
        labels = [classifier.labels[int(row.argmax())] for row in probs]
        seconds = time.perf_counter() - started
        detail = (
            f"{classifier.name} {classifier.version} ({getattr(classifier, 'backend', 'dynamic')} backend) "
            f"ran in {seconds:.1f} s; samples: {labels}"
        )
        return Check("model", "OK", detail)

    return _guard("model", body)


def _check_broker(settings: WorkerSettings) -> Check:
    def body() -> Check:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(settings.librdkafka_common())
        metadata = admin.list_topics(timeout=5)
        brokers = ", ".join(f"{b.host}:{b.port}" for b in metadata.brokers.values())
        return Check("broker", "OK", f"{settings.bootstrap_servers} answered; brokers: {brokers}")

    check = _guard("broker", body)
    if check.verdict == "FAIL":
        detail = (
            f"{settings.bootstrap_servers} did not answer ({check.detail}): start a broker "
            "(`make kafka-up`) or set SENTIMENT_BOOTSTRAP_SERVERS"
        )
        return Check("broker", "FAIL", detail)
    return check


def _check_topics(settings: WorkerSettings) -> list[Check]:
    names = [settings.input_topic, settings.output_topic, settings.dlq_topic]
    try:
        counts = describe_topics(settings.librdkafka_common(), names)
    except Exception as exc:  # noqa: BLE001
        return [Check("topics", "FAIL", f"{type(exc).__name__}: {exc}")]
    checks = []
    for name in names:
        count = counts.get(name)
        if count is None:
            checks.append(Check(f"topic {name}", "FAIL", "missing: run `sentiment-worker topics create`"))
        else:
            checks.append(Check(f"topic {name}", "OK", f"{count} partitions"))
    return checks
