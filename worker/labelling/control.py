"""The fleet's models, steered by the control topic: each replica reads the desired state (`schemas.control`)
when it starts and serves it, follows every change while it runs, and reports what it serves on the status
topic.

    control topic ──► ControlReader ──► ModelControl.apply: verify (files match the hash, manifest), load
                                        beside, probe ──► Labeller.replace_primary / set_shadow
    status topic  ◄── StatusReporter ◄── what the Labeller serves, a problem, the shadow's agreement

A desired state is data: it names directories and their content hash. A directory whose files do not match,
that fails the model checks (worker.model.manifest: nothing is deserialized before), or whose model cannot
label the probe is refused: the replica keeps serving what it served, says so (log, metric, status), and
never half-swaps. The Kafka clients here read and write the two small topics only; they take the worker's
connection settings (bootstrap, security) and nothing of the Kafka door.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from schemas.control import (
    DESIRED_KEY,
    REPLICA_KEY_PREFIX,
    DesiredState,
    ModelChoice,
    ReplicaStatus,
    ServedRef,
    parse_desired,
)
from worker.config import Sections, librdkafka_common
from worker.errors import ConfigurationError
from worker.labelling.labeller import Labeller, ModelChangeRefused
from worker.labelling.loading import LoadedModel, load_model
from worker.model.manifest import UnverifiedModelError, verify_model_dir

__all__ = [
    "ControlReader",
    "ModelControl",
    "load_choice",
    "model_choice",
    "model_control_mode",
    "produce_desired",
    "served_ref",
]

log = logging.getLogger(__name__)

_POLL_S = 1.0
_READ_TO_END_S = 10.0


def model_control_mode(sections: Sections, command: str) -> str:
    """`topic`, `api` or `off` for `command` (run | serve), resolving `model_control=auto`: topic for run, api
    for serve when an API token guards it."""
    mode = sections.live.model_control
    if mode != "auto":
        return mode
    if command == "run":
        return "topic"
    return "api" if sections.http.api_token is not None else "off"


def model_choice(directory: Path) -> ModelChoice:
    """`directory` as a control record names it (the path as given, the content hash of its files), verified
    first. Raises UnverifiedModelError saying why it cannot be named."""
    verified = verify_model_dir(directory)
    return ModelChoice(path=str(directory), content_hash=verified.content_hash)


def produce_desired(
    conf: dict[str, Any], topic: str, desired: DesiredState, *, timeout_s: float = 30.0
) -> None:
    """Produces `desired` under the `desired` key of control topic `topic` (librdkafka settings `conf`) and
    waits for its acknowledgement. Raises ConfigurationError when it is not acknowledged."""
    errors: list[str] = []

    def delivered(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            errors.append(str(error))

    # acks=all + idempotence: the one record the whole fleet follows is written once, durably.
    producer = Producer({**conf, "enable.idempotence": True, "linger.ms": 0})
    producer.produce(topic, desired.model_dump_json().encode(), DESIRED_KEY, on_delivery=delivered)
    left = producer.flush(timeout_s)
    if left or errors:
        reason = errors[0] if errors else f"not acknowledged within {timeout_s:g} s"
        raise ConfigurationError(f"the desired state was not written to {topic}: {reason}")


def load_choice(sections: Sections, choice: ModelChoice, role: str) -> LoadedModel:
    """The model `choice` names, loaded as the settings load models (a shadow with its share of the CPU
    threads), after its directory's files were checked against the choice's hash and its manifest. Raises
    ModelChangeRefused saying why it will not be served."""
    directory = Path(choice.path)
    if not directory.is_dir():
        raise ModelChangeRefused(f"{role} model {choice.path}: no such directory on this replica")
    try:
        verified = verify_model_dir(directory)
    except UnverifiedModelError as exc:
        raise ModelChangeRefused(f"{role} model {choice.path} refused: {exc}") from None
    if verified.content_hash != choice.content_hash:
        raise ModelChangeRefused(
            f"{role} model {choice.path}: its files hash to {verified.content_hash[:12]}…, the control "
            f"record names {choice.content_hash[:12]}…: refused (the directory changed, or the record is "
            "wrong)"
        )
    model = dataclasses.replace(sections.model, model=choice.path)
    if role == "shadow":
        cores = model.cpu_threads or os.cpu_count() or 1
        model = dataclasses.replace(model, cpu_threads=max(1, round(cores * sections.live.shadow_cpu_share)))
    try:
        loaded = load_model(model, sections.batching)
    except ConfigurationError as exc:
        raise ModelChangeRefused(f"{role} model {choice.path} could not be loaded: {exc}") from None
    if loaded.content_hash != choice.content_hash:  # changed between the check and the load
        raise ModelChangeRefused(f"{role} model {choice.path} changed while it was loaded: refused")
    return loaded


def served_ref(model: LoadedModel) -> ServedRef:
    """How the status topic names a model a replica serves."""
    return ServedRef(
        name=model.ref.name, version=model.ref.version, content_hash=model.content_hash, path=model.path
    )


class ControlReader:
    """Reads the control topic from its beginning (a consumer without a group: it commits nothing); `read()`
    returns the newest desired state seen so far, `None` before any."""

    def __init__(self, sections: Sections) -> None:
        conf = librdkafka_common(sections.kafka, sections.security)
        conf.update({"group.id": f"{sections.kafka.group_id}.control-reader", "enable.auto.commit": False})
        self._topic = sections.live.control_topic_of(sections.kafka.group_id)
        self._consumer = Consumer(conf)
        self._assigned = False
        self.desired: DesiredState | None = None
        self.refused: str | None = None  # why the newest record was not taken

    def read(self, timeout_s: float = 0.0) -> DesiredState | None:
        """Takes in what the topic holds (up to its end, waiting at most `timeout_s` for it); the newest
        valid desired state. A missing topic is no desired state (logged once)."""
        if not self._assign():
            return self.desired
        deadline = time.monotonic() + timeout_s
        while True:
            message = self._consumer.poll(max(0.0, min(0.2, deadline - time.monotonic())))
            if message is None:
                if time.monotonic() >= deadline or self._at_end():
                    return self.desired
                continue
            error = message.error()
            if error is not None:
                # GROUP_AUTHORIZATION_FAILED: the client looks up the coordinator of its group even with
                # assign(); nothing is committed, so the worker needs no ACL on that group.
                if error.code() not in (KafkaError._PARTITION_EOF, KafkaError.GROUP_AUTHORIZATION_FAILED):
                    log.warning("control topic %s: %s", self._topic, error)
                if time.monotonic() >= deadline or error.code() == KafkaError._PARTITION_EOF:
                    return self.desired
                continue
            if message.key() == DESIRED_KEY:
                self._take(message.value(), message.offset())

    def close(self) -> None:
        self._consumer.close()

    def _take(self, value: bytes | None, offset: int | None) -> None:
        try:
            desired = parse_desired(value)
        except ValueError as exc:
            self.refused = f"control record at offset {offset} is not a desired state, ignored: {exc}"
            log.error("%s", self.refused)
            return
        self.refused = None
        self.desired = desired

    def _assign(self) -> bool:
        if self._assigned:
            return True
        try:
            metadata = self._consumer.list_topics(self._topic, timeout=5.0).topics.get(self._topic)
        except KafkaException as exc:  # no broker answered: the Kafka door says so; asked again later
            log.warning("control topic %s not read: %s", self._topic, exc.args[0] if exc.args else exc)
            return False
        if metadata is None or metadata.error is not None or not metadata.partitions:
            log.info(
                "no control topic %s: serving the configured model (`topics create` makes it)",
                self._topic,
            )
            return False
        self._consumer.assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])
        self._assigned = True
        return True

    def _at_end(self) -> bool:
        _, high = self._consumer.get_watermark_offsets(
            TopicPartition(self._topic, 0), timeout=5.0, cached=False
        )
        position = self._consumer.position([TopicPartition(self._topic, 0)])[0].offset
        return position >= high if position >= 0 else high == 0


class ModelControl:
    """Follows the control topic for `labeller` (on a thread of its own, from `start()` to `stop()`), and
    reports to the status topic every `status_interval_s` and after each change. A desired state without a
    primary means the model the settings name (SENTIMENT_MODEL), loaded again only if it is not served.
    `problem` starts as what start-up could not serve."""

    def __init__(
        self,
        sections: Sections,
        labeller: Labeller,
        *,
        reader: ControlReader | None = None,
        load: Callable[[ModelChoice, str], LoadedModel] | None = None,
        problem: str | None = None,
    ) -> None:
        self._sections = sections
        self._status_topic = sections.live.status_topic_of(sections.kafka.group_id)
        self._labeller = labeller
        self._reader = reader
        self._load = load or (lambda choice, role: load_choice(sections, choice, role))
        self._applied: DesiredState | None = None
        self.problem = problem
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # With the control topic comes the status topic; `serve` alone (the admin route) reports on its API.
        self._status = (
            Producer({**librdkafka_common(sections.kafka, sections.security), "linger.ms": 0})
            if reader is not None
            else None
        )

    def apply(self, desired: DesiredState | None) -> None:
        """Serves what `desired` says (None: as started). Each part that cannot be served is refused and kept
        as `problem`; what was served stays."""
        if desired is None or desired == self._applied:
            return
        problems = [
            problem
            for problem in (self._apply_primary(desired.primary), self._apply_shadow(desired.shadow))
            if problem is not None
        ]
        self._applied = desired
        self.problem = "; ".join(problems) or None
        self.report()

    @property
    def desired(self) -> DesiredState | None:
        """The desired state this replica last applied (None: none yet, it serves what it started with)."""
        return self._applied

    def status(self) -> ReplicaStatus:
        """What this replica serves now, its problem, and the shadow's agreement."""
        primary, shadow = self._labeller.serving
        return ReplicaStatus(
            worker_id=self._sections.kafka.worker_id,
            primary=served_ref(primary),
            shadow=served_ref(shadow) if shadow is not None else None,
            desired_at_ms=self._applied.changed_at_ms if self._applied is not None else None,
            problem=self.problem or (self._reader.refused if self._reader is not None else None),
            agreement=self._labeller.agreement,
            reported_at_ms=int(time.time() * 1000),
        )

    def report(self) -> None:
        """Produces this replica's status on the status topic (with the control topic only)."""
        if self._status is None:
            return
        status = self.status()
        key = (REPLICA_KEY_PREFIX + self._sections.kafka.worker_id).encode()
        try:
            self._status.produce(self._status_topic, status.model_dump_json().encode(), key)
            self._status.poll(0)
        except Exception as exc:  # noqa: BLE001 - a report is best effort
            log.warning("could not report to %s: %s", self._status_topic, exc)

    def start(self) -> None:
        """Follows the control topic from now on (a daemon thread; it applies what the topic says once the
        Labeller has started)."""
        self._thread = threading.Thread(target=self._follow, name="model-control", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._status is not None:
            self._status.flush(timeout_s)
        if self._reader is not None:
            self._reader.close()

    # ----- on the control thread -----
    def _follow(self) -> None:
        while not self._labeller.started and not self._stop.wait(0.1):
            pass
        next_report = 0.0
        while not self._stop.is_set():
            try:
                if self._reader is not None:
                    self.apply(self._reader.read())
                if time.monotonic() >= next_report:
                    self.report()
                    next_report = time.monotonic() + self._sections.live.status_interval_s
            except Exception:  # noqa: BLE001 - the control thread never dies: the replica keeps serving
                log.exception("following the control topic failed; trying again")
            self._stop.wait(_POLL_S)

    def _apply_primary(self, choice: ModelChoice | None) -> str | None:
        current = self._labeller.serving[0]
        if choice is None and current.path == self._sections.model.model:
            return None
        if choice is not None and current.content_hash == choice.content_hash:
            return None
        return self._change("primary", choice, self._labeller.replace_primary)

    def _apply_shadow(self, choice: ModelChoice | None) -> str | None:
        current = self._labeller.serving[1]
        if choice is None:
            if current is not None:
                self._labeller.set_shadow(None)
                log.info("shadow %s %s removed", current.ref.name, current.ref.version)
            return None
        if current is not None and current.content_hash == choice.content_hash:
            return None
        return self._change("shadow", choice, self._labeller.set_shadow)

    def _change(
        self, role: str, choice: ModelChoice | None, change: Callable[[LoadedModel], None]
    ) -> str | None:
        """Loads `choice` (None: the configured model) and hands it to `change`; the refusal's reason."""
        started = time.monotonic()
        try:
            loaded = self._load_configured() if choice is None else self._load(choice, role)
            change(loaded)
        except ModelChangeRefused as exc:
            self._labeller.count_change(role, "refused")
            log.error("%s; still serving %s", exc, _describe(self._labeller, role))
            return str(exc)
        log.info(
            "%s is now %s %s (%s), in %.1f s",
            role,
            loaded.ref.name,
            loaded.ref.version,
            loaded.path,
            time.monotonic() - started,
        )
        return None

    def _load_configured(self) -> LoadedModel:
        try:
            return load_model(self._sections.model, self._sections.batching)
        except ConfigurationError as exc:
            raise ModelChangeRefused(
                f"the configured model {self._sections.model.model} could not be loaded: {exc}"
            ) from None


def _describe(labeller: Labeller, role: str) -> str:
    primary, shadow = labeller.serving
    model = primary if role == "primary" else shadow
    return f"{model.ref.name} {model.ref.version}" if model is not None else "no shadow"
