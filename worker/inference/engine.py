"""The one labelling engine: every entry point (the Kafka worker, `serve`, `predict`, `bench`) submits texts
to it and gets a future of their labels, in input order.

    submit(texts) ─► pending ─► queue thread: take what is due, tokenize it together, plan token-budget
        ▲           (one queue)  batches (length groups) ─► model lanes (split on failure; OOM lowers budget)
        └─────── Future[Labelled] per submission, set when the last batch holding its texts is done ◄──┘

What is due: a submission made with `gather_ms=None` (a Kafka window, a `predict` chunk: already gathered
by its caller) is taken at once, as a group of its own, and its batches queue behind the lanes' work, so the
lanes go from one window to the next without idling. A submission with a `gather_ms` (an HTTP request)
waits for a lane to be free — gathering the requests that arrive meanwhile into the same batches, as
continuous batching does — and, while the model is idle, at most `gather_ms` for company (or until a full
batch waits: `max_batch_size` texts, or without a count cap texts enough to fill the token budget at the
mean length labelled so far); the requests waiting together are tokenized and planned as one group, so
batches are cut across them.

The per-item failure rule: a text the tokenizer cannot take, or that the model still fails on alone (after a
failing batch was split in halves), gets an `InferenceFailure` in its place; its batch-mates are labelled.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType

from schemas.dead_letter import DeadLetterKind
from worker.config import BatchingSettings, ModelSettings
from worker.errors import OperationError
from worker.inference.batch_plan import plan_batches
from worker.inference.batch_shape import TextLengths, batch_size_cap
from worker.inference.classifier import Classifier, InferenceFailure, Output, sequences_for
from worker.inference.model_calls import GroupStats, TokenBudget, predict_splitting
from worker.inference.token_budget import choose_token_budget
from worker.inference.tuning.probes import MemoryProbe
from worker.model.long_text import merge_chunk_outputs

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.5
_WARM_UP_TEXTS = ["这个商品很好，物流也快", "太差了"]


class EngineClosed(OperationError):
    """The engine is stopping (or stopped): it takes nothing new, or stopped before labelling these texts."""


@dataclass(frozen=True)
class Labelled:
    """One submission's labels: one output per text, in input order (a probability row, or the failure that
    replaced it), and where its time went."""

    outputs: list[Output]
    stats: GroupStats
    """Measurements of the work these texts were labelled in (shared with the submissions taken with them)."""
    queued_seconds: float
    """From `submit` to the queue thread taking it."""
    labelling_seconds: float = 0.0
    """From the queue thread taking it to its labels (tokenizing and the model, wall time): at most the
    time since `submit` less `queued_seconds`, however many lanes ran its batches side by side."""


@dataclass
class _Submission:
    texts: list[str]
    future: Future[Labelled]
    accepted_at: float
    gather_until: float | None  # None: due at once


@dataclass
class _Group:
    """Submissions taken together: tokenized, planned and labelled as one."""

    submissions: list[_Submission]
    taken_at: float
    per_text: list[int | InferenceFailure]  # each text's number of sequences, or why it has none
    ids: list[list[int]]
    outputs: list[Output | None]
    stats: GroupStats = field(default_factory=GroupStats)
    batches_left: int = 0


@dataclass(frozen=True)
class EngineOptions:
    """At most `max_batch_size` texts (None: no count cap) and `max_batch_tokens` padded tokens (batch size
    x longest sequence) in one model call; `close()` labels what was submitted for at most
    `shutdown_timeout_s`."""

    max_batch_size: int | None
    max_batch_tokens: int
    shutdown_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")

    @classmethod
    def from_settings(
        cls,
        batching: BatchingSettings,
        model: ModelSettings,
        classifier: Classifier,
        *,
        shutdown_timeout_s: float,
        memory_probe: MemoryProbe | None = None,
    ) -> EngineOptions:
        """The worker's and `serve`'s options for the classifier's device: the token budget as the settings
        choose it (a number, or calibrated: `choose_token_budget`, on a GPU by default; `memory_probe`
        replaces the real device-memory probe) and the count cap (`batch_size_cap`: none on a GPU unless
        max_batch_size is set)."""
        budget = choose_token_budget(batching, model, classifier, memory_probe=memory_probe).max_batch_tokens
        return cls(batch_size_cap(batching, model, classifier), budget, shutdown_timeout_s)


class Engine:
    """Labels submitted texts with `classifier` within `options`; see the module docstring.

    The token budget is halved below a batch that runs out of memory. `on_labelled(stats, token_budget)` is
    called once per group of submissions labelled together (the metrics), on a lane thread. `niceness` > 0
    lowers the CPU priority of the engine's own threads (a shadow model's: the primary's threads go first).
    """

    def __init__(
        self,
        classifier: Classifier,
        options: EngineOptions,
        *,
        on_labelled: Callable[[GroupStats, int], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        name: str = "engine",
        niceness: int = 0,
    ) -> None:
        self._classifier = classifier
        self._niceness = niceness
        self._max_batch_size = options.max_batch_size
        self._shutdown_timeout_s = options.shutdown_timeout_s
        self._budget = TokenBudget(options.max_batch_tokens)
        self._on_labelled = on_labelled
        self._clock = clock
        self._name = name
        self._lane_count = max(1, classifier.parallel_calls)
        # The lanes are daemon threads of the engine's own (not a ThreadPoolExecutor's, which the interpreter
        # joins at exit): a model call stuck past the shutdown time must not keep the process alive.
        self._lanes: list[threading.Thread] = []
        self._lane_inbox: queue.SimpleQueue[tuple[_Group, list[int], list[int]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._stats_lock = threading.Lock()  # GroupStats and TokenBudget, updated by lanes side by side
        self._pending: deque[_Submission] = deque()
        self._pending_texts = 0
        self._waiting_batches = 0  # queued on the lanes, not started
        self._groups_in_flight = 0
        self._last_progress_at = clock()
        self._closing = False
        self._lengths = TextLengths()  # of the texts labelled (under _cond)

    # ----- public -----
    def start(self, *, warm_up: bool = True) -> Engine:
        """Starts the queue thread and the model lanes; `warm_up` labels two reviews first, so the first
        real submission does not pay for lazy initialisation."""
        if self._thread is not None:
            raise RuntimeError("the engine is already started")
        self._lanes = [
            threading.Thread(target=self._lane, name=f"{self._name}-lane_{i}", daemon=True)
            for i in range(self._lane_count)
        ]
        for lane in self._lanes:
            lane.start()
        self._thread = threading.Thread(target=self._run, name=f"{self._name}-queue", daemon=True)
        self._thread.start()
        if warm_up:
            started = time.monotonic()
            on_labelled, self._on_labelled = self._on_labelled, None  # not counted in the metrics
            try:
                self.submit(_WARM_UP_TEXTS).result()
            except BaseException:
                self.close(timeout_s=0.0)  # a model that cannot label leaves no threads behind
                raise
            finally:
                self._on_labelled = on_labelled
            with self._cond:
                self._lengths = TextLengths()  # two short texts: not what the traffic looks like
            log.info("model warmed up in %.2f s", time.monotonic() - started)
        return self

    def submit(self, texts: Sequence[str], *, gather_ms: float | None = None) -> Future[Labelled]:
        """Queues `texts` for labelling; the future gets one output per text, in input order.

        `gather_ms` None: due at once (the caller gathered them). A number: they wait for a free lane and,
        while the model is idle, up to `gather_ms` for other submissions to share their batches. Thread-safe,
        never blocks; the caller bounds what it submits. A future cancelled before its texts are taken drops
        them.
        Raises EngineClosed once `close()` began."""
        now = self._clock()
        gather_until = None if gather_ms is None else now + gather_ms / 1000.0
        submission = _Submission(list(texts), Future(), now, gather_until)
        if not submission.texts:
            submission.future.set_result(Labelled([], GroupStats(), 0.0))
            return submission.future
        with self._cond:
            if self._closing or self._thread is None:
                raise EngineClosed("the engine is stopping" if self._closing else "the engine is not started")
            self._pending.append(submission)
            self._pending_texts += len(submission.texts)
            self._cond.notify_all()
        return submission.future

    @property
    def token_budget(self) -> int:
        """The padded-token budget of the next batches (lowered by out-of-memory events)."""
        return self._budget.current

    @property
    def tokens_per_text(self) -> float | None:
        """The mean tokens per text labelled lately (None before the first): how many texts fill a batch."""
        with self._cond:
            return self._lengths.mean

    @property
    def out_of_memory_lowerings(self) -> int:
        """How many out-of-memory events lowered the token budget."""
        return self._budget.lowered

    def stalled_s(self) -> float:
        """Seconds the lanes have been working without finishing a batch (0 when they have nothing to do):
        what liveness watches."""
        with self._cond:
            if not self._groups_in_flight:
                return 0.0
            return max(0.0, self._clock() - self._last_progress_at)

    def close(self, timeout_s: float | None = None) -> None:
        """Takes nothing new; labels everything submitted (within `timeout_s`, by default the options'
        `shutdown_timeout_s`), then stops the threads. Submissions still unlabelled then get EngineClosed."""
        timeout_s = self._shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            while self._groups_in_flight and time.monotonic() < deadline:
                self._cond.wait(max(0.001, deadline - time.monotonic()))
            left = list(self._pending)
            self._pending.clear()
            unfinished = self._groups_in_flight
        for submission in left:
            if submission.future.set_running_or_notify_cancel():
                submission.future.set_exception(
                    EngineClosed("the engine stopped before labelling these texts")
                )
        if unfinished:
            log.warning("the model is still busy after %.0f s of stopping; leaving it", timeout_s)
        for _ in self._lanes:
            self._lane_inbox.put(None)  # each lane ends after the batches queued before it
        if not unfinished:
            for lane in self._lanes:
                lane.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Engine:
        """Started (and warmed up) unless it already was; `with` closes it."""
        return self if self._thread is not None else self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # ----- the queue thread -----
    def _run(self) -> None:
        _lower_this_threads_priority(self._niceness)
        while True:
            with self._cond:
                taken = self._take_due()
                while taken is None:
                    if self._closing and not self._pending:
                        return
                    self._cond.wait(self._wait_s())
                    taken = self._take_due()
                self._groups_in_flight += 1
            self._label(taken)

    def _take_due(self) -> list[_Submission] | None:
        """The next group, if something is due now (called with the lock held): a submission its caller
        gathered alone, else every gathering submission up to the next such one; cancelled ones dropped."""
        if not self._pending or not self._is_due():
            return None
        group = [self._pending.popleft()]
        if group[0].gather_until is not None:
            while self._pending and self._pending[0].gather_until is not None:
                group.append(self._pending.popleft())
        self._pending_texts -= sum(len(s.texts) for s in group)
        taken = [s for s in group if s.future.set_running_or_notify_cancel()]
        return taken or None

    def _is_due(self) -> bool:
        if self._closing or any(s.gather_until is None for s in self._pending):
            return True
        if self._full_batch_waits():
            return self._waiting_batches < self._lane_count  # a full batch: as soon as a lane can take it
        if self._groups_in_flight:
            # The model is busy: gather what arrives until no batch is left waiting for a lane (one is
            # about to be free), so busy periods make full batches, not many small ones.
            return self._waiting_batches == 0
        return self._clock() >= min(s.gather_until or 0.0 for s in self._pending)

    def _full_batch_waits(self) -> bool:
        """Enough texts wait for one batch (called with the lock held): `max_batch_size` of them, or without
        a count cap enough to fill the token budget at the mean length labelled so far."""
        if self._max_batch_size is not None:
            return self._pending_texts >= self._max_batch_size
        mean = self._lengths.mean
        return mean is not None and self._pending_texts * mean >= self._budget.current

    def _wait_s(self) -> float:
        if self._pending and not self._waiting_batches >= self._lane_count and not self._groups_in_flight:
            soonest = min(s.gather_until or 0.0 for s in self._pending)
            return max(0.0005, soonest - self._clock())
        return _IDLE_WAIT_S  # woken by submit(), close() and a lane starting a batch

    def _label(self, submissions: list[_Submission]) -> None:
        """Tokenizes the taken submissions together, plans their batches and queues them on the lanes."""
        taken_at = self._clock()
        texts = [text for s in submissions for text in s.texts]
        ids, per_text = _tokenize(self._classifier, texts)
        group = _Group(submissions, taken_at, per_text, ids, [None] * len(ids))
        group.stats.tokenize_seconds = self._clock() - taken_at
        lengths = [len(row) for row in ids]
        group.stats.real_tokens = sum(lengths)
        batches = plan_batches(
            lengths,
            max_batch_size=self._max_batch_size,
            max_batch_tokens=self._budget.current,
            call_overhead_tokens=self._classifier.call_overhead_tokens,
        )
        if not batches:
            self._finish(group)
            return
        # Dearest batches first, so the lanes finish the group close together (not on its longest batch).
        batches.sort(key=lambda batch: -len(batch) * max(lengths[i] for i in batch))
        group.batches_left = len(batches)
        with self._cond:
            self._waiting_batches += len(batches)
        for batch in batches:
            self._lane_inbox.put((group, batch, lengths))

    # ----- on a lane -----
    def _lane(self) -> None:
        _lower_this_threads_priority(self._niceness)
        while True:
            work = self._lane_inbox.get()
            if work is None:
                return
            self._run_batch(*work)

    def _run_batch(self, group: _Group, batch: list[int], lengths: list[int]) -> None:
        with self._cond:
            self._waiting_batches -= 1
            if self._pending:
                self._cond.notify_all()  # a lane is free for what waits
        try:
            predict_splitting(
                self._classifier,
                group.ids,
                lengths,
                batch,
                group.outputs,
                group.stats,
                self._budget,
                self._stats_lock,
                self._clock,
            )
        except BaseException as exc:  # noqa: BLE001 - a bug, never bad input: these texts fail, not the engine
            log.error("a model lane failed", exc_info=True)
            for index in batch:
                group.outputs[index] = InferenceFailure(
                    DeadLetterKind.INFERENCE_FAILED, f"engine error: {exc}"
                )
        with self._stats_lock:
            group.batches_left -= 1
            last = group.batches_left == 0
        with self._cond:
            self._last_progress_at = self._clock()
        if last:
            self._finish(group)

    def _finish(self, group: _Group) -> None:
        """Hands each submission its outputs (chunked texts' rows averaged back into one)."""
        if self._on_labelled is not None:
            try:
                self._on_labelled(group.stats, self._budget.current)
            except Exception:  # noqa: BLE001 - metrics must not lose labels
                log.warning("recording a labelled group failed", exc_info=True)
        merged = _merge(group.per_text, group.outputs)
        labelling_seconds = self._clock() - group.taken_at
        with self._cond:
            self._lengths.observe(len(group.per_text), group.stats.real_tokens)
        position = 0
        for submission in group.submissions:
            n = len(submission.texts)
            queued = group.taken_at - submission.accepted_at
            labelled = Labelled(merged[position : position + n], group.stats, queued, labelling_seconds)
            submission.future.set_result(labelled)
            position += n
        with self._cond:
            self._groups_in_flight -= 1
            self._last_progress_at = self._clock()
            self._cond.notify_all()


def _lower_this_threads_priority(niceness: int) -> None:
    """The calling thread's CPU priority lowered by `niceness` (Linux: a thread is its own scheduling entity,
    so this leaves the process's other threads as they are); nothing when 0 or where it is not allowed."""
    if niceness <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + niceness)
    except OSError:
        log.warning("could not lower the priority of thread %s", threading.current_thread().name)


def _tokenize(
    classifier: Classifier, texts: list[str]
) -> tuple[list[list[int]], list[int | InferenceFailure]]:
    """All sequences of `texts` and each text's number of sequences; a text the tokenizer fails on gets the
    failure instead (the others are tokenized again without it)."""
    try:
        ids, counts = sequences_for(classifier, texts)
        return ids, list(counts) if counts is not None else [1] * len(texts)
    except Exception:  # noqa: BLE001 - find the text(s) at fault, one by one
        pass
    all_ids: list[list[int]] = []
    per_text: list[int | InferenceFailure] = []
    for text in texts:
        try:
            ids, counts = sequences_for(classifier, [text])
        except Exception as exc:  # noqa: BLE001 - this text's own failure
            reason = f"the tokenizer cannot take this text: {type(exc).__name__}: {exc}"
            log.warning("dead-lettering one text: %s", reason)
            per_text.append(InferenceFailure(DeadLetterKind.INFERENCE_FAILED, reason[:500]))
            continue
        all_ids.extend(ids)
        per_text.append(len(ids))
    return all_ids, per_text


def _merge(per_text: list[int | InferenceFailure], outputs: list[Output | None]) -> list[Output]:
    """One output per text: its sequence's row, its chunks' rows averaged, or the first failure among them."""
    if any(row is None for row in outputs):
        raise AssertionError("inference left sequences without an output")  # a bug, never bad input
    rows: list[Output] = [row for row in outputs if row is not None]
    merged: list[Output] = []
    position = 0
    for entry in per_text:
        if isinstance(entry, InferenceFailure):
            merged.append(entry)
            continue
        merged.extend(merge_chunk_outputs(rows[position : position + entry], [entry]))
        position += entry
    return merged
