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
from collections.abc import Callable
from contextlib import ExitStack
from threading import Event
from typing import NamedTuple

from confluent_kafka import Message
from prometheus_client import CollectorRegistry

from worker.config import Sections, librdkafka_common
from worker.health import HealthState
from worker.kafka import kafka_clients
from worker.kafka.assignment import Assignment
from worker.kafka.authorization import consume_refusal, is_authorization_error
from worker.kafka.backpressure import Backpressure
from worker.kafka.checkpoint import Checkpoint, CommitOptions, checkpoint_for
from worker.kafka.consume_window import ConsumeWindow
from worker.kafka.consumer import handle_consume_error
from worker.kafka.kafka_clients import KafkaClients, Rebalance
from worker.kafka.lag_gauges import LagGauges
from worker.kafka.loop_context import LoopContext
from worker.kafka.loop_observer import LoopObserver
from worker.kafka.partitions import PartitionBook, PartitionKey
from worker.kafka.port import PortApi, open_port
from worker.kafka.producer import ResultProducer, SourcePosition
from worker.kafka.publisher import Publisher
from worker.kafka.records import InputMessage, OutboundRecords, headers_of
from worker.kafka.recovery import Recovery
from worker.kafka.registry_decode import RegistryUnavailable, RegistryWaitStopped, registry_decoder
from worker.kafka.registry_wait import RegistryWait
from worker.kafka.result_encoding import ResultEncoder, registered_result_encoder
from worker.kafka.run_tracker import RunSummary, RunTracker, drain_budget_s
from worker.kafka.shadow_output import ShadowOutput
from worker.kafka.undecodable import UNDECODABLE_CODES, UndecodableBatches
from worker.kafka.undecodable_inputs import UndecodableInputs
from worker.kafka.window_shape import WindowShape
from worker.kafka.windows import DecodeOptions, PreparedWindow, prepare_window, window_records
from worker.labelling.in_order import InOrder
from worker.labelling.labeller import Labeller, Predictions
from worker.metrics import WorkerMetrics, create_metrics

log = logging.getLogger(__name__)

_IDLE_POLL_S = 0.2
_BUSY_POLL_S = 0.01
_MAX_WINDOW_BYTES = 64 * 1024 * 1024


class _StartedParts(NamedTuple):
    """What `_start()` builds, once: the loop, the drain and the callbacks use these."""

    context: LoopContext  # the consumer, the window and the books the helpers share
    producer: ResultProducer
    records: OutboundRecords
    publisher: Publisher  # sends the records, takes their delivery reports in
    windows: InOrder[PreparedWindow]  # submitted to the Labeller, collected in order (bounded)
    checkpoint: Checkpoint  # what may be committed: offsets, or the transaction
    undecodable: UndecodableInputs  # partitions held by a record batch the consumer cannot read
    observer: LoopObserver  # gauges, stalled partitions, the broker check, progress lines
    assignment: Assignment  # rebalance callbacks, pausing
    recovery: Recovery  # rewinds; exactly_once's recovery from a transaction given up


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
        self._registry_wait = RegistryWait(self._health, self._metrics, clock)
        self._parts: _StartedParts | None = None  # built once by _start()
        self._shadow_output: ShadowOutput | None = None  # with shadow_topic or shadow_sample_topic
        self._backpressure = Backpressure()
        self.http_address: tuple[str, int] | None = None

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
        api, self.http_address = open_port(stack, s, self._api, self._registry, self._health)
        producer = self._clients.open_producer(s.kafka, s.security, s.delivery)
        # Closed last, on every exit path (a StartupError too): hands librdkafka's queued log lines over.
        stack.callback(producer.close)
        records = self._outbound_records(producer, self._result_encoder())
        checkpoint_type = checkpoint_for(s.delivery.delivery)
        checkpoint_type.prepare(
            producer, s.kafka, s.security, s.delivery
        )  # exactly_once: the transactional id
        self._health.broker_reachable = True
        stack.enter_context(self._labeller)  # started and warm; closed on the way out
        self._health.model_warm = True
        if api is not None:
            api.attach(stack, labeller=self._labeller, metrics=self._metrics)
        rebalance = Rebalance(  # served inside consume(), once started
            lambda partitions: self._started.assignment.on_assign(partitions),
            lambda partitions: self._started.assignment.on_revoke(partitions),
            lambda partitions: self._started.assignment.on_lost(partitions),
        )
        consumer = self._clients.open_consumer(
            s.kafka, s.security, s.delivery, rebalance, transactional=checkpoint_type.transactional
        )
        # Closing leaves the group; its revoke callback flushes and commits what is acknowledged.
        stack.callback(consumer.close)
        undecodable = UndecodableBatches(s.kafka.undecodable_batch_retries, consumer.high_watermark)
        context = LoopContext(
            consumer,
            self._window,
            self._book,
            undecodable,
            self._run,
            self._health,
            self._metrics,
            self._clock,
        )
        options = CommitOptions.from_settings(s.kafka, s.security, s.delivery, report=self._delivery_problem)
        publisher = Publisher(producer, records, context, options.refusal)
        checkpoint = checkpoint_type(options, publisher, context)
        if ShadowOutput.wanted(s.live):  # the shadow's results and disagreements, best effort
            self._shadow_output = ShadowOutput(s, self._labeller.labels, self._clock)
            stack.callback(self._shadow_output.close, 5.0)
        windows: InOrder[PreparedWindow] = InOrder(self._labeller, capacity=s.batching.max_queued_windows)
        self._parts = self._helpers(context, producer, records, publisher, windows, checkpoint)
        consumer.subscribe()
        log.info(
            "consuming %s as group %s → results to %s, dead letters to %s; %s",
            s.kafka.input_topic,
            s.kafka.group_id,
            s.kafka.output_topic,
            s.kafka.dlq_topic,
            kafka_clients.delivery_description(s.kafka, s.delivery),
        )

    def _helpers(
        self,
        context: LoopContext,
        producer: ResultProducer,
        records: OutboundRecords,
        publisher: Publisher,
        windows: InOrder[PreparedWindow],
        checkpoint: Checkpoint,
    ) -> _StartedParts:
        """The loop's named helpers, over the started clients."""
        s = self._settings
        observer = LoopObserver(context, producer, self._lag_gauges, s.observability.stuck_partition_s)
        assignment = Assignment(context, checkpoint, observer)
        recovery = Recovery(context, checkpoint, assignment, s.kafka.input_topic)
        undecodable = UndecodableInputs(context, s.kafka.receive_message_max_bytes)
        return _StartedParts(
            context,
            producer,
            records,
            publisher,
            windows,
            checkpoint,
            undecodable,
            observer,
            assignment,
            recovery,
        )

    def _export_metrics(self) -> None:
        s = self._settings
        self._labeller.observe(self._metrics)
        # Exported at 0 from the start, so rate() counts the first messages (a series is born at its value).
        self._metrics.messages_consumed.labels(s.kafka.input_topic)
        self._metrics.results_published.labels(s.kafka.output_topic)

    def _result_encoder(self) -> ResultEncoder | None:
        """JSON, or a registry format with the result schema registered (waiting for the registry while it
        cannot be reached; not ready meanwhile)."""
        while True:
            try:
                s = self._settings
                encoder, registered = registered_result_encoder(s.registry, s.kafka.output_topic)
            except RegistryUnavailable as exc:
                self._registry_wait.away(str(exc), held=0)
                if self._run.wait_for_stop(self._registry_wait.seconds_left()):
                    raise _StoppedStarting(
                        "stop requested while waiting for the Schema Registry to register the result schema"
                    ) from None
                continue
            self._registry_wait.back()
            if registered is not None:
                log.info(
                    "results as %s, schema id %d under subject %s (compatibility %s)",
                    self._settings.registry.output_format,
                    registered.schema_id,
                    registered.subject,
                    registered.compatibility,
                )
            return encoder

    def _outbound_records(self, producer: ResultProducer, encode: ResultEncoder | None) -> OutboundRecords:
        """How results and dead letters are built, for the output topics as the broker describes them."""
        s = self._settings
        partition_counts, max_message_bytes = kafka_clients.output_topic_limits(producer, s.kafka, s.security)
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
        run, parts = self._run, self._started
        while True:
            # Step 1. A delivery that failed for good stops the worker before it goes past it.
            parts.publisher.raise_for_error()
            if run.stop_requested:
                return "stop requested"
            self._health.loop_turned()
            # Step 2. Windows the Labeller labelled, published in input order.
            self._publish_labelled()
            # Step 3. The window, when due (full, waited max_wait_ms, or the run's limit), to the Labeller.
            self._submit_due_window()
            # Step 4. Consume as much as there is room for, or wait for the Labeller (backpressure); while
            # exactly-once recovers from a transaction given up, nothing (every partition is read again).
            if parts.recovery.pending:
                parts.recovery.turn()
                messages = []
            else:
                messages = self._consume_or_wait()
            self._accept_all(messages)
            # Step 5. Delivery reports in; what they made committable stored (or committed).
            self._settle()
            # Step 6. Lag gauges and the broker check, when due.
            parts.observer.observe()
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
        self._started.assignment.set_paused(decision.pause)
        if not decision.consume:
            self._publish_labelled(timeout_s=_BUSY_POLL_S)
            return []
        if len(self._window) and room > 0:
            timeout = self._window.remaining_wait_s()
        else:
            timeout = _BUSY_POLL_S if windows.in_flight or len(self._window) else _IDLE_POLL_S
        messages = self._started.context.consumer.consume(max(1, room), timeout)
        if messages:
            self._run.activity()
        return messages

    def _settle(self) -> None:
        self._started.producer.poll(0)  # serves delivery callbacks
        self._started.checkpoint.commit()
        if self._shadow_output is not None:
            self._shadow_output.publish_done()

    def _idle(self, *, consumed: int) -> bool:
        """Nothing consumed this turn and nothing in the window, the Labeller or the producer."""
        windows, producer = self._started.windows, self._started.producer
        return not consumed and not len(self._window) and not windows.in_flight and producer.pending() == 0

    def _drain(self) -> None:
        """Stop order: fetch no more, label and publish what was fetched, flush, commit (then close)."""
        parts = self._started
        publisher, windows, checkpoint = parts.publisher, parts.windows, parts.checkpoint
        self._health.stopping = True
        self._metrics.ready.set(0)
        self._run.stopping()
        deadline = self._run.stop_deadline(drain_budget_s(self._settings.delivery.shutdown_timeout_s))
        assert deadline is not None  # stopping
        while (len(self._window) or windows.in_flight) and self._clock() < deadline:
            if len(self._window) and windows.has_room() and not self._submit_window():
                RegistryWait.stopping_with(len(self._window.take()))
            self._publish_labelled(timeout_s=0.1)
        remaining = publisher.flush(max(0.0, deadline - self._clock()))
        checkpoint.commit()
        checkpoint.commit_final(deadline, self._clock)
        self._run.summary.unacknowledged_at_stop = remaining + windows.in_flight
        if remaining or windows.in_flight:
            log.warning(
                "stopping with %d outputs unacknowledged and %d windows unlabelled after %.0f s: their "
                "inputs stay uncommitted and will be processed again",
                remaining,
                windows.in_flight,
                self._settings.delivery.shutdown_timeout_s,
            )
        publisher.raise_for_error()

    # ----- per message and per window -----
    def _accept_all(self, messages: list[Message]) -> None:
        """Takes one consume call's messages into the window (data), or handles them (errors); the counts
        and metrics once for all of them."""
        now = self._clock()
        book, window, undecodable = self._book, self._window, self._started.undecodable
        consumed: dict[str, int] = {}
        moved: set[PartitionKey] = set()  # seeked this turn: the rest of their messages here are stale
        undecodable.tick(now, moved)
        for message in messages:
            err = message.error()
            if err is not None:
                if is_authorization_error(err):  # a missing ACL: retrying would only log it forever
                    raise consume_refusal(self._settings.kafka, self._settings.security, err)
                if err.code() in UNDECODABLE_CODES and message.partition() is not None:
                    undecodable.error(message, err.str(), now, moved)
                elif handle_consume_error(err, self._settings.kafka.input_topic):  # True: brokers unreachable
                    self._health.broker_reachable = False
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            assert topic is not None and partition is not None and offset is not None  # data messages do
            if undecodable.skip((topic, partition), offset, now, moved):
                continue
            ts_type, ts = message.timestamp()
            position = SourcePosition(topic, partition, offset, ts if ts_type and ts >= 0 else None)
            value = message.value()
            epoch = book.consumed((topic, partition), offset, position.timestamp_ms)
            item = InputMessage(position, message.key(), value, now, epoch, headers_of(message))
            window.add(item, len(value or b""))
            consumed[topic] = consumed.get(topic, 0) + 1
            self._health.broker_reachable = True
        for topic, count in consumed.items():
            self._run.consumed(count)
            self._metrics.messages_consumed.labels(topic).inc(count)

    def _submit_window(self) -> bool:
        """The window's messages decoded here, their valid reviews submitted to the Labeller; False when it
        was not. While the Schema Registry cannot answer (each answer waited for at most
        schema_registry_timeout_s, and not past a stop request), the window stays as it is (full, it stops
        consumption) and is prepared again after a wait; /readyz says why meanwhile. Nothing of it is
        dead-lettered for that."""
        if self._registry_wait.pausing():
            return False
        items = self._window.take()
        try:
            prepared = prepare_window(items, self._decode_options)
        except RegistryUnavailable as exc:
            for item in items:
                self._window.add(item, len(item.value or b""))
            if not isinstance(exc, RegistryWaitStopped):
                self._registry_wait.away(str(exc), held=len(self._window))
            return False
        self._registry_wait.back()
        self._started.windows.submit(prepared, prepared.reviews)
        return True

    def _publish_window(self, prepared: PreparedWindow, predictions: Predictions) -> None:
        """Publishes exactly one record per input of the window that is still ours, in input order."""
        records = window_records(prepared, predictions, self._book, self._started.records, self._clock())
        checkpoint = self._started.checkpoint
        rewind = checkpoint.publish(records)
        recovery = self._started.recovery
        if rewind:  # an aborted transaction: its inputs are read and labelled again
            recovery.rewind(rewind)
        if checkpoint.recovering is not None and not recovery.pending:
            recovery.hold()
        if not rewind and checkpoint.recovering is None and self._shadow_output is not None:
            self._shadow_output.add(prepared, predictions)
        self._metrics.in_flight_messages.set(self._book.offsets.outstanding())

    def _delivery_problem(self, problem: str | None) -> None:
        """Why results cannot be published now (/readyz), or None once they can."""
        self._health.delivery_problem = problem
        self._metrics.ready.set(1 if self._health.readiness()[0] else 0)

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
