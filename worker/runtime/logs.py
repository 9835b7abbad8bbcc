"""How every command logs: the worker's lines on stderr, the libraries' noise kept down (PaddleNLP below
WARNING, librdkafka's normal retries at DEBUG and its repeated lines once per 10 s, the registry client's
request lines at DEBUG)."""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Callable

from worker.config import LIBRDKAFKA_LOGGER

__all__ = ["NormalRetries", "RepeatedLines", "configure_logging", "quiet_libraries"]


def configure_logging(level: str) -> None:
    """The worker's log lines on stderr from `level` up; PaddleNLP's from WARNING up (all at DEBUG)."""
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    quiet_libraries()
    _paddlenlp_floor().level = logging.DEBUG if level == "DEBUG" else logging.WARNING
    for client in ("httpx", "httpx2"):  # the Schema Registry client's HTTP: a line per request at INFO
        logging.getLogger(client).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)


class NormalRetries(logging.Filter):
    """librdkafka lines that report a normal retry as a warning go down to DEBUG: on a fresh broker the
    idempotent producer's "Failed to acquire idempotence PID ... Coordinator load in progress: retrying"
    (the transaction coordinator is still loading; librdkafka asks again and succeeds). Below DEBUG the
    line is dropped; at DEBUG it passes, marked DEBUG."""

    _PATTERN = re.compile(r"(Coordinator load in progress|Coordinator not available).*: retrying")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not self._PATTERN.search(record.getMessage()):
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


class RepeatedLines(logging.Filter):
    """Lets a line through once per `interval_s` (lines alike but for their numbers count as one): a broker
    that cannot be reached makes librdkafka say the same thing many times a second. The next line let
    through says how many were held back."""

    def __init__(self, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._seen: dict[tuple[int, str], tuple[float, int]] = {}  # key -> (last let through, held back)

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, re.sub(r"\d+", "#", record.getMessage()))
        now = self._clock()
        last, held = self._seen.get(key, (float("-inf"), 0))
        if now - last < self._interval_s:
            self._seen[key] = (last, held + 1)
            return False
        if held:
            record.msg = f"{record.getMessage()} (and {held} alike in the last {self._interval_s:g} s)"
            record.args = None
        if len(self._seen) > 1000:  # bounded: forget the oldest
            self._seen.pop(next(iter(self._seen)))
        self._seen[key] = (now, 0)
        return True


def quiet_libraries() -> None:
    """What every command does first, before Paddle or PaddleNLP are imported (`main` calls it).

    Paddle's import-time UserWarnings (no ccache, setuptools replacing distutils) say nothing about this
    worker: ignored. PaddleNLP logs every file it loads at INFO through its own colourised handler: only its
    warnings pass (configure_logging("DEBUG") lets all through), without colour codes unless stderr is a
    terminal. Nothing here imports Paddle.
    """
    warnings.filterwarnings("ignore", category=UserWarning, module=r"paddle\..*|_distutils_hack")
    _paddlenlp_floor()
    # Every command's librdkafka lines (also those of commands that configure no logging, shown by
    # logging's last-resort handler): normal retries at DEBUG, a repeated line once per 10 s.
    librdkafka = logging.getLogger(LIBRDKAFKA_LOGGER)
    if not any(isinstance(f, NormalRetries) for f in librdkafka.filters):
        librdkafka.addFilter(NormalRetries())  # first: a demoted line is not counted as a repeat
    if not any(isinstance(f, RepeatedLines) for f in librdkafka.filters):
        librdkafka.addFilter(RepeatedLines())
    if not sys.stderr.isatty():
        os.environ.setdefault("NO_COLOR", "1")  # honoured by colorlog, PaddleNLP's formatter


class _LevelFloor(logging.Filter):
    """Drops records below `level`. A filter rather than the logger's level, which PaddleNLP sets to DEBUG
    when it is imported (after us)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


def _paddlenlp_floor() -> _LevelFloor:
    """The floor on PaddleNLP's logger ("PaddleNLP", it does not propagate), added once (WARNING)."""
    logger = logging.getLogger("PaddleNLP")
    for existing in logger.filters:
        if isinstance(existing, _LevelFloor):
            return existing
    floor = _LevelFloor(logging.WARNING)
    logger.addFilter(floor)
    return floor
