"""The one place that wires the stages together and owns the worker's lifecycle.

poll thread:  consume → window → decode → labeller.label ─┐                ┌─► publish in input order → acks →
                                                         ▼ (bounded)     │    offset tracker → store/commit
Labeller (engine):   tokenize → token-budget batches → model lanes ──────┘ (windows collected in order)
Exactly-once mode publishes each window and its offsets in one transaction instead.
Stop: fetch no more, finish the fetched windows, flush, commit, close.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack, suppress
from threading import Event
from typing import NamedTuple, Protocol

from confluent_kafka import KafkaException, Message
from prometheus_client import CollectorRegistry

from worker.config import Sections, librdkafka_common
from worker.health import HealthServer, HealthState
from worker.kafka import kafka_clients
from worker.kafka.authorization import consume_refusal, is_authorization_error
from worker.kafka.backpressure import Backpressure
from worker.kafka.committers import CommitOptions, Committer, committer_for
from worker.kafka.consume_window import ConsumeWindow
from worker.kafka.consumer import ReviewConsumer, handle_consume_error
from worker.kafka.kafka_clients import KafkaClients, Rebalance
from worker.kafka.lag_gauges import LagGauges
from worker.kafka.partitions import PartitionBook, PartitionKey, format_assignment_change, format_partitions
from worker.kafka.producer import ResultPublisher, SourcePosition
from worker.kafka.records import InputMessage, OutboundRecords
from worker.kafka.registry_decode import RegistryUnavailable, RegistryWaitStopped, registry_decoder
from worker.kafka.result_encoding import ResultEncoder, registered_result_encoder
from worker.kafka.run_tracker import RunSummary, RunTracker, drain_budget_s
from worker.kafka.shadow_output import ShadowOutput
from worker.kafka.undecodable import UNDECODABLE_CODES, DeadLetterRange, Seek, UndecodableBatches
from worker.kafka.window_shape import WindowShape
from worker.kafka.windows import DecodeOptions, PreparedWindow, prepare_window, window_records
from worker.labelling.in_order import InOrder
from worker.labelling.labeller import Labeller, Predictions
from worker.metrics import WorkerMetrics, create_metrics

log = logging.getLogger(__name__)

_IDLE_POLL_S = 0.2
_BUSY_POLL_S = 0.01
_METRICS_EVERY_S = 1.0
_BROKER_CHECK_EVERY_S = 10.0
_MAX_WINDOW_BYTES = 64 * 1024 * 1024
_REGISTRY_RETRY_S = (0.5, 1.0, 2.0, 5.0)  # waits before preparing a window again while the registry is away


class PortApi(Protocol):
    """The HTTP API on the worker's own port (`run` with http_api), answered by the worker's Labeller:
    `worker.http.serving.WorkerApi`, handed in by the caller (the run path never imports http)."""

    def open(
        self, stack: ExitStack, settings: Sections, registry: CollectorRegistry, health: HealthState
    ) -> tuple[str, int]:
        """Listens on `http_host:http_port` (the API says 503 until `attach`); `stack` closes it."""
        ...

    def attach(self, stack: ExitStack, *, labeller: Labeller, metrics: WorkerMetrics) -> None:
        """Starts answering requests through `labeller`."""
        ...


class _StartedParts(NamedTuple):
    """What `_start()` builds, once: the loop, the drain and the callbacks use these."""

    consumer: ReviewConsumer
    publisher: ResultPublisher
    records: OutboundRecords
    windows: InOrder[PreparedWindow]  # submitted to the Labeller, collected in order (bounded)
    committer: Committer
    undecodable: UndecodableBatches  # partitions held by a record batch the consumer cannot read


class SentimentWorker:
    """A consumer-group member that labels reviews and publishes one record per input offset."""

    def __init__(
        self,
        settings: Sections,
        labeller: Labeller,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        stop: Event | None = None,
        api: PortApi | None = None,
        clients: KafkaClients | None = None,
    ) -> None:
        """`settings`: every section but the model's (the Labeller's). `clients` opens the producer and the
        consumer (the real ones unless given: a unit test passes fakes); `api` answers HTTP on the worker's
        port when `http_api` is on."""
        if settings.http.http_api and settings.http.http_port and api is None:
            raise ValueError("http_api needs the API to serve: pass api=worker.http.serving.WorkerApi()")
        self._settings = settings
        self._api = api
        self._clients = clients if clients is not None else KafkaClients()
        self._labeller = labeller
        self._registry = registry if registry is not None else CollectorRegistry()
        self._metrics: WorkerMetrics = create_metrics(
            self._registry, low_confidence=settings.observability.low_confidence
        )
        self._clock = clock
        self._health = HealthState(settings.observability.liveness_timeout_s, clock)
        self._run = RunTracker(clock, stop)  # stop conditions and the run's summary
        self._book = PartitionBook()  # epochs, paused set, offset tracker, lag clock
        self._lag_gauges = LagGauges(
            self._metrics,
            self._book,
            librdkafka_common(settings.kafka, settings.security),
            settings.kafka.input_topic,
        )
        self._window_shape = WindowShape.for_device(settings.batching, on_gpu=labeller.on_gpu)
        self._window: ConsumeWindow[InputMessage] = self._new_window()
        # The registry's answers are waited for on the poll thread, given up when a stop is requested.
        decoder = registry_decoder(settings.registry, settings.limits, stop=self._run.stop_event)
        self._decode_options = DecodeOptions.from_settings(settings.registry, settings.limits, decoder)
        self._registry_retry_at = 0.0  # the window is not prepared before this while the registry is away
        self._registry_failures = 0
        self._parts: _StartedParts | None = None  # built once by _start()
        self._shadow_output: ShadowOutput | None = None  # with shadow_topic or shadow_sample_topic
        self._backpressure = Backpressure()
        self.http_address: tuple[str, int] | None = None
        self._gauges_due = False  # refresh the gauges on the next loop turn (a new assignment)
        self._next_metrics_at = 0.0  # when the loop refreshes the gauges and checks the broker next
        self._next_broker_check_at = 0.0
        self._progress_mark = (0, clock())  # inputs done and when, at the last progress line
        self._rewind_pending = False  # exactly_once gave a transaction up: every partition to read again

    # ----- public -----
    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    @property
    def health(self) -> HealthState:
        return self._health

    def request_stop(self) -> None:
        """Asks the loop to stop; safe from a signal handler (it only sets an event)."""
        self._run.request_stop()

    def run(self, *, max_messages: int | None = None, idle_exit_s: float | None = None) -> RunSummary:
        """Runs until stopped, `max_messages` inputs are done, or `idle_exit_s` passes with no input."""
        started = self._clock()
        summary = self._run.summary
        with ExitStack() as stack:
            try:
                self._start(stack)
            except _StoppedStarting as stopped:  # nothing consumed yet: a clean stop
                summary.stop_reason = str(stopped)
                summary.seconds = self._clock() - started
                return summary
            self._run.start(max_messages=max_messages, idle_exit_s=idle_exit_s)
            summary.stop_reason = self._loop()
            self._drain()
        summary.seconds = self._clock() - started
        return summary

    # ----- lifecycle -----
    def _start(self, stack: ExitStack) -> None:
        """Start order, each step closed by `stack` on the way out: the metrics exported at 0, HTTP up (the
        probes answer while the model loads), the producer and the output topics checked, the Labeller's
        models warm, the API attached to it, the consumer in the group."""
        s = self._settings
        self._export_metrics()
        api = self._open_http(stack)
        publisher = self._clients.open_publisher(s.kafka, s.security, s.delivery)
        # Closed last, on every exit path (a StartupError too): hands librdkafka's queued log lines over.
        stack.callback(publisher.close)
        records = self._outbound_records(publisher, self._result_encoder())
        committer_type = committer_for(s.delivery.delivery)
        committer_type.prepare(
            publisher, s.kafka, s.security, s.delivery
        )  # exactly_once: the transactional id
        self._health.broker_reachable = True
        stack.enter_context(self._labeller)  # started and warm; closed on the way out
        self._health.model_warm = True
        if api is not None:
            api.attach(stack, labeller=self._labeller, metrics=self._metrics)
        rebalance = Rebalance(self._on_assign, self._on_revoke, self._on_lost)
        consumer = self._clients.open_consumer(
            s.kafka, s.security, s.delivery, rebalance, transactional=committer_type.transactional
        )
        # Closing leaves the group; its revoke callback flushes and commits what is acknowledged.
        stack.callback(consumer.close)
        committer = committer_type(
            CommitOptions.from_settings(s.kafka, s.security, s.delivery, report=self._delivery_problem),
            consumer,
            publisher,
            self._book,
            records,
            self._run,
            self._metrics,
        )
        if ShadowOutput.wanted(s.live):  # the shadow's results and disagreements, best effort
            self._shadow_output = ShadowOutput(s, self._labeller.labels, self._clock)
            stack.callback(self._shadow_output.close, 5.0)
        windows: InOrder[PreparedWindow] = InOrder(self._labeller, capacity=s.batching.max_queued_windows)
        undecodable = UndecodableBatches(s.kafka.undecodable_batch_retries, consumer.high_watermark)
        self._parts = _StartedParts(consumer, publisher, records, windows, committer, undecodable)
        consumer.subscribe()
        log.info(
            "consuming %s as group %s → results to %s, dead letters to %s; %s",
            s.kafka.input_topic,
            s.kafka.group_id,
            s.kafka.output_topic,
            s.kafka.dlq_topic,
            kafka_clients.delivery_description(s.kafka, s.delivery),
        )

    def _export_metrics(self) -> None:
        s = self._settings
        self._labeller.observe(self._metrics)
        # Exported at 0 from the start, so rate() counts the first messages (a series is born at its value).
        self._metrics.messages_consumed.labels(s.kafka.input_topic)
        self._metrics.results_published.labels(s.kafka.output_topic)

    def _open_http(self, stack: ExitStack) -> PortApi | None:
        """The HTTP port: the API with the probes (http_api), or the probes and metrics alone; the API
        answers 503 until it is attached to the Labeller. Returns the API to attach, if any."""
        s = self._settings
        http = s.http
        api = self._api if http.http_port and http.http_api else None
        if api is not None:  # the API on the same port, through this worker's Labeller
            self.http_address = api.open(stack, s, self._registry, self._health)
            log.info(
                "HTTP API, metrics and health on http://%s:%d (/v1/sentiment /metrics ...)",
                *self.http_address,
            )
        elif http.http_port:
            server = HealthServer(
                http.http_host,
                http.http_port,
                self._registry,
                self._health,
                max_header_bytes=http.http_max_header_bytes,
                header_timeout_s=http.http_header_timeout_s,
            )
            stack.callback(server.close)
            self.http_address = server.address
            log.info("metrics and health on http://%s:%d (/metrics /healthz /readyz)", *server.address)
        return api

    def _result_encoder(self) -> ResultEncoder | None:
        """JSON, or a registry format with the result schema registered (waiting for the registry while it
        cannot be reached; not ready meanwhile)."""
        while True:
            try:
                s = self._settings
                encoder, registered = registered_result_encoder(s.registry, s.kafka.output_topic)
            except RegistryUnavailable as exc:
                self._registry_away(str(exc))
                if self._run.wait_for_stop(self._registry_retry_at - self._clock()):
                    raise _StoppedStarting(
                        "stop requested while waiting for the Schema Registry to register the result schema"
                    ) from None
                continue
            self._registry_back()
            if registered is not None:
                log.info(
                    "results as %s, schema id %d under subject %s (compatibility %s)",
                    self._settings.registry.output_format,
                    registered.schema_id,
                    registered.subject,
                    registered.compatibility,
                )
            return encoder

    def _outbound_records(self, publisher: ResultPublisher, encode: ResultEncoder | None) -> OutboundRecords:
        """How results and dead letters are built, for the output topics as the broker describes them."""
        s = self._settings
        partition_counts, max_message_bytes = kafka_clients.output_topic_limits(
            publisher, s.kafka, s.security
        )
        return OutboundRecords(
            labels=self._labeller.labels,
            output_topic=s.kafka.output_topic,
            dlq_topic=s.kafka.dlq_topic,
            worker_id=s.kafka.worker_id,
            partitioning=s.kafka.output_partitioning,
            partition_counts=partition_counts,
            max_message_bytes=max_message_bytes,
            clock=self._clock,
            encode=encode,
        )

    def _loop(self) -> str:
        """One turn a step, until a stop condition holds."""
        run = self._run
        self._next_metrics_at = 0.0
        self._next_broker_check_at = self._clock() + _BROKER_CHECK_EVERY_S
        while True:
            # Step 1. A delivery that failed for good stops the worker before it goes past it.
            self._started.committer.raise_for_error()
            if run.stop_requested:
                return "stop requested"
            self._health.loop_turned()
            # Step 2. Windows the Labeller labelled, published in input order.
            self._publish_labelled()
            # Step 3. The window, when due (full, waited max_wait_ms, or the run's limit), to the Labeller.
            self._submit_due_window()
            # Step 4. Consume as much as there is room for, or wait for the Labeller (backpressure); while
            # exactly-once recovers from a transaction given up, nothing (every partition is read again).
            if self._rewind_pending:
                self._recover()
                messages = []
            else:
                messages = self._consume_or_wait()
            self._accept_all(messages)
            # Step 5. Delivery reports in; what they made committable stored (or committed).
            self._settle()
            # Step 6. Lag gauges and the broker check, when due.
            self._observe()
            reason = run.stop_reason(idle=self._idle(consumed=len(messages)))
            if reason is not None:
                return reason

    def _publish_labelled(self, timeout_s: float = 0.0) -> None:
        for prepared, labelled in self._started.windows.collect(timeout_s):
            self._publish_window(prepared, labelled)

    def _submit_due_window(self) -> None:
        if self._window_shape.fills_token_budget:  # a GPU window: about one batch at the mean length so far
            labeller = self._labeller
            self._window.max_messages = self._window_shape.cap(
                labeller.token_budget, labeller.tokens_per_text
            )
        in_progress = self._book.offsets.unacknowledged()
        due = self._window.is_due() or self._run.limit_reached(in_progress)
        if len(self._window) and due and self._started.windows.has_room():
            self._submit_window()

    def _consume_or_wait(self) -> list[Message]:
        """Messages consumed this turn: up to the window's room (and the run's), unless the Labeller is busy
        enough that backpressure says wait for it (see worker/kafka/backpressure.py)."""
        windows = self._started.windows
        room = self._window.max_messages - len(self._window)
        run_room = self._run.room(self._book.offsets.unacknowledged())
        if run_room is not None:
            room = min(room, run_room)
        decision = self._backpressure.decide(room=room, model_busy=windows.in_flight > 0, now=self._clock())
        self._set_paused(decision.pause)
        if not decision.consume:
            self._publish_labelled(timeout_s=_BUSY_POLL_S)
            return []
        if len(self._window) and room > 0:
            timeout = self._window.remaining_wait_s()
        else:
            timeout = _BUSY_POLL_S if windows.in_flight or len(self._window) else _IDLE_POLL_S
        messages = self._started.consumer.consume(max(1, room), timeout)
        if messages:
            self._run.activity()
        return messages

    def _settle(self) -> None:
        self._started.publisher.poll(0)  # serves delivery callbacks
        self._started.committer.settle()
        if self._shadow_output is not None:
            self._shadow_output.publish_done()

    def _observe(self) -> None:
        now = self._clock()
        if now >= self._next_metrics_at or self._gauges_due:
            self._gauges_due = False
            self._update_gauges()
            self._next_metrics_at = now + _METRICS_EVERY_S
        if now >= self._next_broker_check_at:
            self._check_broker()
            self._next_broker_check_at = now + _BROKER_CHECK_EVERY_S
            self._say_progress(now)

    def _say_progress(self, now: float) -> None:
        """Every `_BROKER_CHECK_EVERY_S` while inputs get done: how many, and the rate since the last line."""
        summary, (done_before, at_before) = self._run.summary, self._progress_mark
        if summary.done > done_before:
            rate = (summary.done - done_before) / max(1e-9, now - at_before)
            log.info(
                "labelled %d (%d results, %d dead letters): %.0f msg/s over the last %.0f s",
                summary.done,
                summary.results,
                summary.dead_letters,
                rate,
                now - at_before,
            )
        self._progress_mark = (summary.done, now)

    def _idle(self, *, consumed: int) -> bool:
        """Nothing consumed this turn and nothing in the window, the Labeller or the producer."""
        windows, publisher = self._started.windows, self._started.publisher
        return not consumed and not len(self._window) and not windows.in_flight and publisher.pending() == 0

    def _drain(self) -> None:
        """Stop order: fetch no more, label and publish what was fetched, flush, commit (then close)."""
        parts = self._started
        publisher, windows, committer = parts.publisher, parts.windows, parts.committer
        self._health.stopping = True
        self._metrics.ready.set(0)
        self._run.stopping()
        deadline = self._run.stop_deadline(drain_budget_s(self._settings.delivery.shutdown_timeout_s))
        assert deadline is not None  # stopping
        while (len(self._window) or windows.in_flight) and self._clock() < deadline:
            if len(self._window) and windows.has_room() and not self._submit_window():
                self._leave_window_unprepared()
            self._publish_labelled(timeout_s=0.1)
        remaining = publisher.flush(max(0.0, deadline - self._clock()))
        committer.settle()
        committer.commit_final(deadline, self._clock)
        self._run.summary.unacknowledged_at_stop = remaining + windows.in_flight
        if remaining or windows.in_flight:
            log.warning(
                "stopping with %d outputs unacknowledged and %d windows unlabelled after %.0f s: their "
                "inputs stay uncommitted and will be processed again",
                remaining,
                windows.in_flight,
                self._settings.delivery.shutdown_timeout_s,
            )
        committer.raise_for_error()

    # ----- per message and per window -----
    def _accept_all(self, messages: list[Message]) -> None:
        """Takes one consume call's messages into the window (data), or handles them (errors); the counts
        and metrics once for all of them."""
        now = self._clock()
        book, window, undecodable = self._book, self._window, self._started.undecodable
        consumed: dict[str, int] = {}
        moved: set[PartitionKey] = set()  # seeked this turn: the rest of their messages here are stale
        for action in undecodable.tick(now):
            self._carry_out(action, moved)
        for message in messages:
            err = message.error()
            if err is not None:
                if is_authorization_error(err):  # a missing ACL: retrying would only log it forever
                    raise consume_refusal(self._settings.kafka, self._settings.security, err)
                if err.code() in UNDECODABLE_CODES and message.partition() is not None:
                    self._unreadable_batch(message, err.str(), now, moved)
                elif handle_consume_error(err, self._settings.kafka.input_topic):  # True: brokers unreachable
                    self._health.broker_reachable = False
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            assert topic is not None and partition is not None and offset is not None  # data messages do
            if (topic, partition) in moved:
                continue
            if undecodable.holds((topic, partition)):
                drop, answer = undecodable.data((topic, partition), offset, now)
                if answer is not None:
                    self._carry_out(answer, moved)
                if drop:
                    continue
            ts_type, ts = message.timestamp()
            position = SourcePosition(topic, partition, offset, ts if ts_type and ts >= 0 else None)
            value = message.value()
            epoch = book.consumed((topic, partition), offset, position.timestamp_ms)
            item = InputMessage(position, message.key(), value, now, epoch, _headers_of(message))
            window.add(item, len(value or b""))
            consumed[topic] = consumed.get(topic, 0) + 1
            self._health.broker_reachable = True
        for topic, count in consumed.items():
            self._run.consumed(count)
            self._metrics.messages_consumed.labels(topic).inc(count)

    def _unreadable_batch(self, message: Message, reason: str, now: float, moved: set[PartitionKey]) -> None:
        """An error event pinning a partition at a record batch the consumer cannot read (see
        worker/kafka/undecodable.py): retried, then probed for its end, then dead-lettered."""
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        if topic is None or partition is None or offset is None or offset < 0 or (topic, partition) in moved:
            return
        action = self._started.undecodable.error((topic, partition), offset, reason, now)
        if action is not None:
            self._carry_out(action, moved)

    def _carry_out(self, action: Seek | DeadLetterRange, moved: set[PartitionKey]) -> None:
        """A probe's seek; or the batch's offsets into the window as dead letters, the partition past them."""
        consumer = self._started.consumer
        moved.add(action.key)
        if isinstance(action, Seek):
            consumer.seek(action.key, action.offset)
            return
        (topic, partition), first, last = action.key, action.first, action.last
        reason = (
            f"the record batch holding offsets {first}-{last} of {topic}[{partition}] could not be read: "
            f"{action.reason} (e.g. it decompresses to more than SENTIMENT_RECEIVE_MESSAGE_MAX_BYTES="
            f"{self._settings.kafka.receive_message_max_bytes} bytes, or uses a codec this client lacks); "
            "nothing "
            "of its keys and values is kept"
        )
        log.warning("%s[%d]: offsets %d-%d dead-lettered as undecodable_batch: %s", *action.key, first, last,
                    action.reason)  # fmt: skip
        now = self._clock()
        for offset in range(first, last + 1):
            position = SourcePosition(topic, partition, offset, None)
            epoch = self._book.consumed(action.key, offset, None)
            self._window.add(InputMessage(position, None, None, now, epoch, None, reason), 0)
        self._run.consumed(last - first + 1)
        self._metrics.messages_consumed.labels(topic).inc(last - first + 1)
        consumer.seek(action.key, last + 1)

    def _submit_window(self) -> bool:
        """The window's messages decoded here, their valid reviews submitted to the Labeller; False when it
        was not. While the Schema Registry cannot answer (each answer waited for at most
        schema_registry_timeout_s, and not past a stop request), the window stays as it is (full, it stops
        consumption) and is prepared again after a wait; /readyz says why meanwhile. Nothing of it is
        dead-lettered for that."""
        if self._registry_failures and self._clock() < self._registry_retry_at:
            return False
        items = self._window.take()
        try:
            prepared = prepare_window(items, self._decode_options)
        except RegistryUnavailable as exc:
            for item in items:
                self._window.add(item, len(item.value or b""))
            if not isinstance(exc, RegistryWaitStopped):
                self._registry_away(str(exc))
            return False
        self._registry_back()
        self._started.windows.submit(prepared, prepared.reviews)
        return True

    def _leave_window_unprepared(self) -> None:
        """Stopping while the window waits for the Schema Registry: a stop does not wait for it. Its inputs
        stay uncommitted, so they are read again by the next run (or the partition's next owner)."""
        items = self._window.take()
        log.warning(
            "stopping with %d inputs that wait for the Schema Registry: left uncommitted, read again later",
            len(items),
        )

    def _registry_back(self) -> None:
        if self._registry_failures:
            log.info("Schema Registry answers again after %d failed tries", self._registry_failures)
            self._registry_failures = 0
            self._health.registry_problem = None

    def _registry_away(self, problem: str) -> None:
        """The registry cannot answer: try again after a pause growing to 5 s; /readyz names `problem`."""
        if not self._registry_failures:
            log.warning(
                "%s; waiting for it, %d inputs held (not ready meanwhile)", problem, len(self._window)
            )
        wait_s = _REGISTRY_RETRY_S[min(self._registry_failures, len(_REGISTRY_RETRY_S) - 1)]
        self._registry_failures += 1
        self._registry_retry_at = self._clock() + wait_s
        self._health.registry_problem = problem
        self._metrics.ready.set(0)

    def _publish_window(self, prepared: PreparedWindow, predictions: Predictions) -> None:
        """Publishes exactly one record per input of the window that is still ours, in input order."""
        records = window_records(prepared, predictions, self._book, self._started.records, self._clock())
        committer = self._started.committer
        rewind = committer.publish(records)
        if rewind:  # an aborted transaction: its inputs are read and labelled again
            self._rewind(rewind)
        if committer.recovering is not None and not self._rewind_pending:
            self._hold_for_recovery()
        if not rewind and committer.recovering is None and self._shadow_output is not None:
            self._shadow_output.add(prepared, predictions)
        self._metrics.in_flight_messages.set(self._book.offsets.outstanding())

    def _rewind(self, partitions: list[PartitionKey]) -> None:
        """Forget everything consumed from `partitions` and read them again from their committed offsets (not
        when stopping: nothing more is read, and the broker may be away)."""
        consumer = self._started.consumer
        self._drop_window_items(partitions)
        self._book.rewind(partitions)  # windows still in the pipeline for them are stale
        self._started.undecodable.forget(partitions)
        if not self._run.stop_requested:
            consumer.rewind_to_committed(partitions)

    def _hold_for_recovery(self) -> None:
        """exactly_once gave a transaction up: everything consumed and not committed is forgotten (windows in
        the pipeline are stale), the partitions paused; `_recover` reads them again once transactions work."""
        assigned = sorted(self._started.consumer.assignment)
        self._drop_window_items(assigned)
        self._book.rewind(assigned)
        self._started.undecodable.forget(assigned)
        self._rewind_pending = True
        self._set_paused(True)

    def _recover(self) -> None:
        """One loop turn of a recovery: partitions paused, polled (rebalances served; what comes is stale and
        dropped), one try at transactions; once they work, every partition is read again from its committed
        offset, which says whether the given-up transaction counted."""
        parts = self._started
        self._set_paused(True)
        for message in parts.consumer.consume(100, _BUSY_POLL_S):
            err = message.error()
            if err is not None and handle_consume_error(err, self._settings.kafka.input_topic):
                self._health.broker_reachable = False
        if not parts.committer.recover():
            return
        assigned = sorted(parts.consumer.assignment)
        try:
            parts.consumer.rewind_to_committed(assigned)
        except KafkaException as exc:
            log.warning("cannot read the committed offsets yet (%s); trying again", exc)
            return
        self._book.rewind(assigned)  # anything consumed meanwhile is stale too
        self._rewind_pending = False
        if assigned:
            log.info("exactly_once: reading again from committed offsets: %s", format_partitions(assigned))

    def _delivery_problem(self, problem: str | None) -> None:
        """Why results cannot be published now (/readyz), or None once they can."""
        self._health.delivery_problem = problem
        self._metrics.ready.set(1 if self._health.readiness()[0] else 0)

    def _set_paused(self, paused: bool) -> None:
        consumer = self._started.consumer
        if paused:
            newly = self._book.pause(consumer.assignment)
            if newly:
                consumer.pause(newly)
        else:
            again = self._book.resume(consumer.assignment)
            if again:
                consumer.resume(again)
        self._metrics.paused.set(1 if self._book.paused else 0)

    # ----- rebalance callbacks (run inside consume(), on the loop's thread) -----
    def _on_assign(self, partitions: list[PartitionKey]) -> None:
        self._metrics.rebalances.labels("assigned").inc()
        self._run.activity()  # the idle timer (--idle-exit-s) restarts with new partitions
        self._book.assigned(partitions)
        # Both lag series of a new partition are measured right after this callback (same loop turn), not
        # set to 0: a partition whose backlog is not fetched yet is behind from its first second.
        self._gauges_due = True
        log.info("%s", format_assignment_change("assigned", partitions, self._book.owned))
        self._set_assigned_count(partitions, added=True)

    def _on_revoke(self, partitions: list[PartitionKey]) -> None:
        """Finish and commit the work of revoked partitions; their not-yet-labelled messages are dropped
        uncommitted, so the next owner reads them again (no loss, no duplicate)."""
        self._metrics.rebalances.labels("revoked").inc()
        self._drop_window_items(partitions)
        committed = self._started.committer.revoked(partitions)
        self._forget(partitions)
        log.info("%s (%s)", format_assignment_change("revoked", partitions, self._book.owned), committed)
        self._set_assigned_count(partitions, added=False)

    def _on_lost(self, partitions: list[PartitionKey]) -> None:
        """Lost partitions may already belong to another member: drop their work, commit nothing."""
        self._metrics.rebalances.labels("lost").inc()
        self._drop_window_items(partitions)
        self._forget(partitions)
        log.warning("lost %s: dropped their in-flight work without committing", format_partitions(partitions))
        self._set_assigned_count(partitions, added=False)

    def _drop_window_items(self, partitions: Iterable[PartitionKey]) -> None:
        gone = set(partitions)
        kept = [
            item for item in self._window.take() if (item.position.topic, item.position.partition) not in gone
        ]
        for item in kept:
            self._window.add(item, len(item.value or b""))

    def _forget(self, partitions: list[PartitionKey]) -> None:
        # librdkafka keeps a partition paused by the app through its revocation: assigned again, it would
        # fetch nothing, and the book (which forgets it here) would never resume it.
        paused = self._book.paused & set(partitions)
        if paused:
            self._started.consumer.resume(paused)
        self._book.forget(partitions)
        self._started.undecodable.forget(partitions)
        m = self._metrics
        for key in partitions:
            for gauge in (m.consumer_lag_messages, m.consumer_lag_seconds, m.partition_stalled_seconds):
                with suppress(KeyError):
                    gauge.remove(key[0], str(key[1]))

    def _set_assigned_count(self, partitions: list[PartitionKey], *, added: bool) -> None:
        # The consumer adds assigned partitions before this callback and removes revoked ones after it.
        consumer = self._started.consumer
        owned = consumer.assignment if added else consumer.assignment - set(partitions)
        self._health.assigned_partitions = len(owned)
        self._metrics.ready.set(1 if self._health.readiness()[0] else 0)

    # ----- observability -----
    def _update_gauges(self) -> None:
        started = time.time()
        self._metrics.in_flight_messages.set(self._book.offsets.outstanding())
        self._watch_progress()
        self._metrics.ready.set(1 if self._health.readiness()[0] else 0)
        self._lag_gauges.refresh(self._started.consumer)
        # Last: a scrape that sees this turn's time sees lag gauges measured after it.
        self._metrics.last_poll_timestamp_seconds.set(started)

    def _watch_progress(self) -> None:
        """Partitions whose work has not moved for longer than stuck_partition_s while inputs wait make
        /readyz fail (each named), and their seconds are exported."""
        now = self._clock()
        stalled = self._book.stalled(now)
        held = self._started.undecodable.held(now)
        for key, (seconds, _why) in held.items():  # held by a batch it cannot read: no progress either
            stalled[key] = max(stalled.get(key, 0.0), seconds)
        self._health.undecodable_batches = {f"{t}[{p}]": why for (t, p), (_s, why) in held.items()}
        for (topic, partition), seconds in stalled.items():
            self._metrics.partition_stalled_seconds.labels(topic, str(partition)).set(seconds)
        limit_s = self._settings.observability.stuck_partition_s
        stuck = {f"{t}[{p}]": s for (t, p), s in stalled.items() if s > limit_s}
        if stuck.keys() - self._health.stuck_partitions.keys():
            log.error(
                "no progress for more than %g s while inputs wait: %s; /readyz fails until they move",
                limit_s,
                ", ".join(f"{name} ({seconds:.0f} s)" for name, seconds in sorted(stuck.items())),
            )
        self._health.stuck_partitions = stuck

    def _check_broker(self) -> None:
        publisher = self._started.publisher
        self._health.broker_reachable = publisher.broker_answers(timeout_s=2.0)

    # ----- helpers -----
    def _new_window(self) -> ConsumeWindow[InputMessage]:
        s = self._settings
        return ConsumeWindow(
            max_messages=self._window_shape.max_messages,
            max_wait_ms=s.batching.max_wait_ms,
            max_bytes=_MAX_WINDOW_BYTES,
            clock=self._clock,
        )

    @property
    def _started(self) -> _StartedParts:
        if self._parts is None:
            raise RuntimeError("the worker is not started")
        return self._parts


class _StoppedStarting(Exception):
    """A stop was asked for while start-up waited (for the registry): nothing was consumed, a clean stop."""


def _headers_of(message: Message) -> list[tuple[str, bytes | None]] | None:
    """A consumed message's headers as the worker keeps them (confluent-kafka gives a list of pairs)."""
    headers = message.headers()
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, dict) else headers
    return [(name, value.encode() if isinstance(value, str) else value) for name, value in pairs]
