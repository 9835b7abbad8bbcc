"""When a run stops, and what it did: a stop request, `max_messages` inputs done, or `idle_exit_s` seconds
without input (the `run` command's --max-messages / --idle-exit-s), and the counts of the run's summary.

Pure bookkeeping (no Kafka calls), owned by the poll thread; only `request_stop()` may come from elsewhere
(a signal handler): it sets an event and nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from threading import Event

__all__ = ["RunSummary", "RunTracker", "drain_budget_s"]

_CLOSE_RESERVE_S = 5.0


def drain_budget_s(shutdown_timeout_s: float) -> float:
    """Of a stop's `shutdown_timeout_s`, what finishing the fetched work (label, publish, flush, commit) may
    take: all of it but a reserve for closing the clients (a fifth, at most `_CLOSE_RESERVE_S`)."""
    return shutdown_timeout_s - min(_CLOSE_RESERVE_S, shutdown_timeout_s / 5)


@dataclass
class RunSummary:
    """What one run did. After a clean stop `results + dead_letters == consumed`, unless a partition was
    revoked or lost mid-run (its unfinished inputs were consumed here and are finished by its next owner)."""

    consumed: int = 0
    results: int = 0
    dead_letters: int = 0
    dead_letters_by_kind: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    stop_reason: str = ""
    unacknowledged_at_stop: int = 0
    first_consumed_at: float | None = None  # clock seconds
    last_acknowledged_at: float | None = None

    @property
    def done(self) -> int:
        """Inputs done: their result or dead letter was acknowledged by the broker."""
        return self.results + self.dead_letters

    @property
    def handed_back(self) -> int:
        """Inputs consumed here but finished elsewhere: their partition went to another member mid-run
        (revoked or lost) or was read again after an aborted transaction. Not lost: uncommitted, so their
        partition's next reader labels them."""
        return max(0, self.consumed - self.done - self.unacknowledged_at_stop)

    @property
    def labelling_seconds(self) -> float:
        """From the first message consumed to the last output acknowledged: the labelling time, without
        start-up (model load, warm-up, joining the group) or the idle wait before a stop."""
        if self.first_consumed_at is None or self.last_acknowledged_at is None:
            return 0.0
        return max(0.0, self.last_acknowledged_at - self.first_consumed_at)

    busy_seconds: float = 0.0
    """Loop turns that had work (something consumed, or in the window, the engine or the producer), summed:
    the labelling time without the idle spells of a trickle."""

    @property
    def messages_per_second(self) -> float:
        """Outputs (results + dead letters) per busy second (the labelling time when nothing was measured
        busy): a topic that trickles is not made to look slow by its quiet spells."""
        seconds = (
            min(self.busy_seconds, self.labelling_seconds)
            if self.busy_seconds > 0
            else self.labelling_seconds
        )
        return self.done / seconds if seconds > 0 else 0.0


class RunTracker:
    """The stop conditions of one run and its summary.

    The bound (`max_messages`) counts inputs done. The loop takes no more inputs than the bound leaves
    room for, counting those still in progress (consumed, owned, output not yet acknowledged); an input
    dropped unfinished (its partition revoked or lost, or rewound after an aborted transaction) is no
    longer in progress, so the room it held opens again for its re-delivery or for other input.
    """

    def __init__(self, clock: Callable[[], float], stop: Event | None = None) -> None:
        self.summary = RunSummary()
        self._clock = clock
        self._stop = stop if stop is not None else Event()  # set before run(): it stops at once
        self._max_messages: int | None = None
        self._idle_exit_s: float | None = None
        self._last_activity_at = clock()
        self._last_turn_at = clock()
        self._stopping_since: float | None = None  # when the stop was first seen (or the run ended)

    def start(self, *, max_messages: int | None = None, idle_exit_s: float | None = None) -> None:
        """Sets the run's bounds (None: no bound) and starts its idle timer."""
        self._max_messages = max_messages
        self._idle_exit_s = idle_exit_s
        self._last_activity_at = self._last_turn_at = self._clock()

    def request_stop(self) -> None:
        """Asks the loop to stop; safe from a signal handler (it only sets an event)."""
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        """A stop was asked for; the first call that sees it starts the stop's clock."""
        if not self._stop.is_set():
            return False
        if self._stopping_since is None:
            self._stopping_since = self._clock()
        return True

    def stopping(self) -> None:
        """The run ends now (a stop condition held): the stop's clock starts, unless a request started it."""
        if self._stopping_since is None:
            self._stopping_since = self._clock()

    def stop_deadline(self, budget_s: float) -> float | None:
        """When `budget_s` from the stop's first sight runs out (the clock's seconds); None while running."""
        if self._stopping_since is None and not self.stop_requested:
            return None
        assert self._stopping_since is not None
        return self._stopping_since + budget_s

    def stop_time_left(self, budget_s: float) -> float | None:
        """Seconds left of `budget_s` since the stop was first seen (never below 0); None while running."""
        deadline = self.stop_deadline(budget_s)
        return None if deadline is None else max(0.0, deadline - self._clock())

    def stop_overdue(self, budget_s: float) -> bool:
        """Stopping, and `budget_s` since the stop was first seen has run out: stop waiting for anything."""
        deadline = self.stop_deadline(budget_s)
        return deadline is not None and self._clock() >= deadline

    @property
    def stop_event(self) -> Event:
        """The stop request as an event, for a wait elsewhere to watch (the Schema Registry's answers)."""
        return self._stop

    def wait_for_stop(self, timeout_s: float) -> bool:
        """Waits up to `timeout_s` (a retry's pause); True when a stop was asked for meanwhile."""
        return self._stop.wait(max(0.0, timeout_s))

    def activity(self) -> None:
        """Input arrived or partitions were assigned: the idle timer (`idle_exit_s`) starts again."""
        self._last_activity_at = self._clock()

    def consumed(self, count: int = 1) -> None:
        """`count` inputs consumed."""
        self.summary.consumed += count
        if self.summary.first_consumed_at is None:
            self.summary.first_consumed_at = self._clock()

    def finished(self, kind: str, count: int = 1) -> None:
        """`count` inputs done: their outputs of `kind` ("result" or a dead-letter kind) were acknowledged."""
        summary = self.summary
        summary.last_acknowledged_at = self._clock()
        if kind == "result":
            summary.results += count
        else:
            summary.dead_letters += count
            summary.dead_letters_by_kind[kind] = summary.dead_letters_by_kind.get(kind, 0) + count

    def room(self, in_progress: int) -> int | None:
        """How many more inputs the run may take (None: unbounded), with `in_progress` inputs consumed,
        still owned and not done. Never below 0."""
        if self._max_messages is None:
            return None
        # Not `max_messages - consumed`: an input dropped unfinished was consumed yet is neither done nor
        # in progress; counting it would leave the run waiting forever for inputs it may not take.
        return max(0, self._max_messages - self.summary.done - in_progress)

    def limit_reached(self, in_progress: int) -> bool:
        """The run has taken all the inputs its bound allows: gather no more, finish what is taken."""
        return self.room(in_progress) == 0

    def stop_reason(self, *, idle: bool) -> str | None:
        """Why the run stops after this loop turn, or None. `idle`: nothing consumed this turn and nothing
        in the pipeline (window, inference, unacknowledged outputs)."""
        now = self._clock()
        if not idle:
            self.summary.busy_seconds += now - self._last_turn_at
        self._last_turn_at = now
        done = self.summary.done
        if self._max_messages is not None and done >= self._max_messages:
            return f"processed {done} messages (--max-messages)"
        waited = self._clock() - self._last_activity_at
        if self._idle_exit_s is not None and idle and waited >= self._idle_exit_s:
            return f"no input for {self._idle_exit_s:g} s (--idle-exit-s)"
        return None
