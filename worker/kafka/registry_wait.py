"""Waiting for the Schema Registry while it cannot answer: the window is held (not dead-lettered), tried again
after a pause growing to 5 s, and /readyz names the problem meanwhile."""

from __future__ import annotations

import logging
from collections.abc import Callable

from worker.health import HealthState
from worker.metrics import WorkerMetrics

__all__ = ["RegistryWait"]

log = logging.getLogger(__name__)

_REGISTRY_RETRY_S = (0.5, 1.0, 2.0, 5.0)  # waits before preparing a window again while the registry is away


class RegistryWait:
    """The poll thread's view of the Schema Registry: failed tries in a row and when to try again."""

    def __init__(self, health: HealthState, metrics: WorkerMetrics, clock: Callable[[], float]) -> None:
        self._health = health
        self._metrics = metrics
        self._clock = clock
        self._retry_at = 0.0  # the window is not prepared before this while the registry is away
        self._failures = 0

    def pausing(self) -> bool:
        """True during the pause after a failed try: nothing is prepared before it ends."""
        return bool(self._failures) and self._clock() < self._retry_at

    def seconds_left(self) -> float:
        """Seconds until the next try (negative: due)."""
        return self._retry_at - self._clock()

    def back(self) -> None:
        """The registry answered."""
        if self._failures:
            log.info("Schema Registry answers again after %d failed tries", self._failures)
            self._failures = 0
            self._health.registry_problem = None

    def away(self, problem: str, held: int) -> None:
        """The registry cannot answer: try again after a pause growing to 5 s; /readyz names `problem`.
        `held`: the inputs waiting for it (for the log line)."""
        if not self._failures:
            log.warning("%s; waiting for it, %d inputs held (not ready meanwhile)", problem, held)
        wait_s = _REGISTRY_RETRY_S[min(self._failures, len(_REGISTRY_RETRY_S) - 1)]
        self._failures += 1
        self._retry_at = self._clock() + wait_s
        self._health.registry_problem = problem
        self._metrics.ready.set(0)

    @staticmethod
    def stopping_with(held: int) -> None:
        """Stopping while the window waits for the Schema Registry: a stop does not wait for it. Its inputs
        stay uncommitted, so they are read again by the next run (or the partition's next owner)."""
        log.warning(
            "stopping with %d inputs that wait for the Schema Registry: left uncommitted, read again later",
            held,
        )
