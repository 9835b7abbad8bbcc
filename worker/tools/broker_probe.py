"""One voice for connection trouble: whether a broker answers at the bootstrap address within
`BROKER_DEADLINE_S`, and what to do when none does, in one line (doctor's broker check, and the check
`produce` makes before it sends anything). librdkafka's own log lines of the attempt (one per retry) are
kept out of the way; the last error among them says why, and picks the fix."""

from __future__ import annotations

import logging
import re
from typing import Any

from worker.config import KafkaSettings, SecuritySettings, librdkafka_common
from worker.errors import OperationError
from worker.tools.checks import Check

BROKER_DEADLINE_S = 10.0
"""How long a command waits for a broker to answer before it gives up (topics, tail, lag, produce, doctor
read cluster metadata with the same deadline)."""

BROKER_FIX = "start a broker (`make kafka-up`) or set SENTIMENT_BOOTSTRAP_SERVERS to one that runs"
CREDENTIALS_FIX = "check SENTIMENT_SASL_USERNAME, SENTIMENT_SASL_PASSWORD and SENTIMENT_SASL_MECHANISM"
TLS_FIX = "check SENTIMENT_SECURITY_PROTOCOL against the broker's listener (and the ssl.* settings)"


def probe_broker(
    kafka: KafkaSettings, security: SecuritySettings, *, timeout_s: float = BROKER_DEADLINE_S
) -> tuple[Check, Any]:
    """Reads cluster metadata once: the verdict (a Check named "broker") and the metadata (None on FAIL)."""
    from confluent_kafka.admin import AdminClient

    collected = _LogLines()
    logger = logging.Logger("probe.librdkafka")  # not registered: this probe's lines only
    logger.addHandler(collected)
    conf: dict[str, Any] = {**librdkafka_common(kafka, security), "logger": logger}
    bootstrap = conf.get("bootstrap.servers") or conf.get("metadata.broker.list")
    try:
        admin = AdminClient(conf)
    except Exception as exc:  # noqa: BLE001 - a check reports, never crashes the report
        detail = f"the client refused its settings ({type(exc).__name__}: {exc})"
        fix = "check SENTIMENT_KAFKA_EXTRA and the SENTIMENT_SASL_* settings"
        return Check("broker", "FAIL", detail, fix), None
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001
        admin.poll(0)  # hands the queued log lines to `logger`
        cause = collected.last_error() or f"{type(exc).__name__}: {exc}"
        detail = f"{bootstrap} did not answer within {timeout_s:g} s ({cause})"
        return Check("broker", "FAIL", detail, broker_fix(collected.messages)), None
    brokers = ", ".join(f"{b.host}:{b.port}" for b in metadata.brokers.values())
    return Check("broker", "OK", f"{bootstrap} answered; brokers: {brokers}"), metadata


def check_broker(
    kafka: KafkaSettings, security: SecuritySettings, *, timeout_s: float = BROKER_DEADLINE_S
) -> Check:
    """doctor's broker check (see `probe_broker`)."""
    return probe_broker(kafka, security, timeout_s=timeout_s)[0]


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


def require_broker(
    kafka: KafkaSettings,
    security: SecuritySettings,
    consequence: str,
    *,
    timeout_s: float = BROKER_DEADLINE_S,
) -> Any:
    """The cluster's metadata, or OperationError in one line (`probe_broker`'s words, then `consequence`,
    e.g. "Nothing was sent."): how every operator command gives up on an unreachable broker."""
    check, metadata = probe_broker(kafka, security, timeout_s=timeout_s)
    if metadata is None:
        raise OperationError(f"{check.detail}: {check.fix}. {consequence}")
    return metadata
