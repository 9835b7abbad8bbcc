"""What every `sentiment-worker` command shares: exit codes, the settings flags and the one way settings are
built from them, logging set-up and model loading. A command fails by raising a category of `worker.errors`
(`ConfigurationError`: exit 2, `OperationError`: exit 1); `main` turns it into the exit code. Command modules
import this, nothing else in `worker/` imports `worker.cli`."""

from __future__ import annotations

import argparse
import faulthandler
import gc
import logging
import os
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeAlias

from pydantic import ValidationError

from worker.config import LIBRDKAFKA_LOGGER, WorkerSettings, environment_warnings, load_settings
from worker.errors import ConfigurationError

__all__ = [
    "NormalRetries",
    "RepeatedLines",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "SETTING_FLAGS",
    "Subparsers",
    "add_column_flags",
    "add_settings_flags",
    "configure_logging",
    "env_config_file",
    "evaluate_model",
    "install_stop_handlers",
    "load_model",
    "name_os_threads",
    "quiet_libraries",
    "rest_idle_threads",
    "use_all_cores",
    "settings_from_args",
]

log = logging.getLogger("worker")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130

# What `build_parser` hands each command module's `register(subparsers)`.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


# ----- settings from flags -----
SETTING_FLAGS = {
    "bootstrap_servers": "Kafka bootstrap servers (SENTIMENT_BOOTSTRAP_SERVERS)",
    "input_topic": "input topic (SENTIMENT_INPUT_TOPIC)",
    "output_topic": "results topic (SENTIMENT_OUTPUT_TOPIC)",
    "dlq_topic": "dead-letter topic (SENTIMENT_DLQ_TOPIC)",
    "group_id": "consumer group (SENTIMENT_GROUP_ID)",
    "model": "model directory or PaddleNLP name (SENTIMENT_MODEL)",
    "device": "gpu | cpu | auto (SENTIMENT_DEVICE)",
    "http_port": "port of /metrics /healthz /readyz (and the API), 0 = off (SENTIMENT_HTTP_PORT)",
    "http_host": "address the HTTP port binds, 127.0.0.1 by default (SENTIMENT_HTTP_HOST)",
    "input_format": "json | text (SENTIMENT_INPUT_FORMAT)",
    "backend": "auto | dynamic | static | onnx | identity (no inference; SENTIMENT_BACKEND)",
    "tokenizer": "auto | fast | slow (SENTIMENT_TOKENIZER)",
    "long_text": "truncate | head_tail | chunk (SENTIMENT_LONG_TEXT)",
}


def add_settings_flags(parser: argparse.ArgumentParser, *names: str) -> None:
    parser.add_argument("--config", type=Path, default=None, help="settings file (JSON or TOML)")
    for name in names:
        kind: Callable[[str], Any] = int if name == "http_port" else str
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, help=SETTING_FLAGS[name])


def add_column_flags(parser: argparse.ArgumentParser) -> None:
    """--text-field / --id-field: where a CSV or JSONL file keeps the text and the id (produce, predict)."""
    parser.add_argument(
        "--text-field", default=None, help="CSV column / JSON field holding the review text (default: text)"
    )
    parser.add_argument(
        "--id-field", default=None, help="CSV column / JSON field holding the review id (default: id, if any)"
    )


def settings_from_args(args: argparse.Namespace) -> WorkerSettings:
    overrides = {name: getattr(args, name, None) for name in SETTING_FLAGS}
    config = getattr(args, "config", None) or env_config_file()
    try:
        settings = load_settings(config, **overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigurationError(f"invalid settings: {problems}") from None
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    # Before logging is configured these go to stderr as bare lines (logging's last resort handler).
    serves_api = settings.http_port > 0 and (getattr(args, "command", None) == "serve" or settings.http_api)
    for warning in environment_warnings(settings, os.environ, serves_api=serves_api):
        log.warning("%s", warning)
    return settings


def env_config_file() -> Path | None:
    # The entry point is the one place that reads the environment (pydantic-settings reads the rest).
    value = os.environ.get("SENTIMENT_CONFIG_FILE")
    return Path(value) if value else None


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
    librdkafka = logging.getLogger(LIBRDKAFKA_LOGGER)
    if not any(isinstance(f, NormalRetries) for f in librdkafka.filters):
        librdkafka.addFilter(NormalRetries())  # first: a demoted line is not counted as a repeat
    if not any(isinstance(f, RepeatedLines) for f in librdkafka.filters):
        librdkafka.addFilter(RepeatedLines())


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


def settings_for_model(model: str, device: str | None, max_seq_len: int | None) -> WorkerSettings:
    """Settings for commands that name their model with their own flags (evaluate, promote): those three
    from the arguments, the rest from the environment / SENTIMENT_CONFIG_FILE like any other setting."""
    try:
        settings = load_settings(env_config_file(), model=model, device=device, max_seq_len=max_seq_len)
    except (ValidationError, ValueError) as exc:
        raise ConfigurationError(f"invalid settings: {exc}") from None
    for warning in environment_warnings(settings, os.environ, serves_api=False):
        log.warning("%s", warning)
    return settings


def load_model(settings: WorkerSettings) -> tuple[Any, Any]:
    """The classifier and its ModelRef, built as the settings say: model, device, max_seq_len, backend
    (dynamic/static/onnx, or identity when allow_identity_model), tokenizer, long_text, cpu_threads,
    FP16/TensorRT."""
    from schemas.sentiment_result import ModelRef
    from worker.model.device import DeviceUnavailableError, activate, choose_device
    from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier

    try:
        choice = choose_device(settings.device)
    except DeviceUnavailableError as exc:
        raise ConfigurationError(f"device: {exc}") from None
    log.info("device %s (%s)", choice.paddle_device, choice.reason)
    activate(choice)
    try:
        classifier = load_classifier(
            settings.model,
            choice,
            max_seq_len=settings.max_seq_len,
            options=InferenceOptions.from_settings(settings),
        )
    except ModelLoadError as exc:
        raise ConfigurationError(f"model: {exc}") from None
    log.info("model %r", classifier)
    return classifier, ModelRef(name=classifier.name, version=classifier.version)


def freeze_loaded_heap() -> None:
    """After the one model of a long-running command is loaded: collects, then moves every object alive
    (Paddle's and PaddleNLP's modules, the model, the tokenizer: millions of objects that live as long as the
    process) out of the garbage collector's reach (`gc.freeze`). Its collections then scan only what the run
    allocates. Without this each full collection walks the whole loaded heap on the poll thread: the worker on
    the identity model drained 18,900–19,800 msg/s with 33.7 µs of poll-thread CPU a review, and 32,200–34,900
    with 19.1 µs once frozen (2-core EPYC). Objects frozen are never freed, so a command that loads several
    models one after the other does not call this."""
    gc.collect()
    gc.freeze()


def evaluate_model(
    model: str, examples: list[Any], path: Path, *, device: str, max_seq_len: int | None, batch_size: int,
    static_probe: bool,
) -> Any:  # fmt: skip
    """`evaluate`'s report of `model` on labelled `examples` read from `path` (evaluate and promote)."""
    from worker.training.evaluate import evaluate

    classifier, _ = load_model(settings_for_model(model, device, max_seq_len))
    return evaluate(
        classifier,
        examples,
        model_ref=model,
        data=str(path),
        batch_size=batch_size,
        static_probe=static_probe,
    )


STOP_GRACE_S = 10.0
"""How long after its shutdown timeout a stop asked for by a signal may still run before the process ends
itself (exit 1): closing clients that do not return."""


def install_stop_handlers(
    request_stop: Callable[[], None], stop_timeout_s: float | None = None
) -> Callable[[], None]:
    """SIGTERM/SIGINT: stop cleanly (`request_stop` only sets an event); a second signal exits at once
    (128 + its number). SIGUSR1 prints every thread's Python stack to stderr and changes nothing else (where a
    stuck worker is stuck). With `stop_timeout_s` (the shutdown timeout), a stop still running `STOP_GRACE_S`
    after it ends the process with exit 1, saying so.

    The signals are acted on by a thread of their own, woken by the byte Python's C-level handler writes to
    `signal.set_wakeup_fd` at once, not by Python handlers: those run only on the main thread between
    bytecodes, so a main thread inside a C call that does not return (a librdkafka call waiting for a broker
    that went away) would never run them. Returns a function that installs the same handlers again (Paddle
    installs its own when it loads)."""
    received: list[int] = []
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def act(signum: int) -> None:
        received.append(signum)
        if len(received) > 1:
            os._exit(128 + signum)
        request_stop()
        if stop_timeout_s is not None:
            watchdog = threading.Thread(
                target=end_overdue_stop, args=(signum, stop_timeout_s), name="stop-watchdog", daemon=True
            )
            watchdog.start()

    def end_overdue_stop(signum: int, timeout_s: float) -> None:
        time.sleep(timeout_s + STOP_GRACE_S)
        log.error(
            "the stop asked for by %s has not ended %g s after it (the shutdown timeout and %g s more): "
            "exiting now; inputs not committed are processed again by the partitions' next owner",
            signal.Signals(signum).name,
            timeout_s + STOP_GRACE_S,
            STOP_GRACE_S,
        )
        os._exit(EXIT_FAILED)

    def watch() -> None:
        while True:
            for signum in os.read(read_fd, 64):
                if signum in (signal.SIGTERM, signal.SIGINT):
                    act(signum)

    def handler(_signum: int, _frame: FrameType | None) -> None:
        """Nothing here: the watching thread acts on the byte the signal wrote to the wakeup fd."""

    threading.Thread(target=watch, name="signal-watch", daemon=True).start()

    def install() -> None:
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    install()
    return install


def name_os_threads() -> None:
    """Every Python thread started from now on carries its name in the kernel too (Linux keeps 15 bytes of
    it), so that `top -H`, `ps -L`, profilers and /proc/<pid>/task/<tid>/comm show engine-queue,
    engine-lane_0 or health-http instead of the process's name; `bench --host-ceiling` reads each thread's
    CPU time by it. CPython 3.11 leaves them unnamed. The main thread keeps the process's name (its thread
    id is the process id). A profile hook installed before (a profiler's) keeps running. A no-op where /proc
    is not writable."""
    previous = threading.getprofile()

    def name_then_step_aside(frame: FrameType, event: Any, arg: Any) -> None:
        # Runs once per thread, at the call of its run(): hands the thread to the hook it replaced.
        sys.setprofile(previous)
        _write_kernel_thread_name(threading.current_thread().name)
        if previous is not None:
            previous(frame, event, arg)

    threading.setprofile(name_then_step_aside)


def _write_kernel_thread_name(name: str) -> None:
    """The calling thread's kernel name (its first 15 bytes); nothing where /proc is not writable."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "wb") as comm:
            comm.write(name.encode("utf-8", "replace")[:15])
    except OSError:
        pass


def use_all_cores() -> None:
    """Paddle's dygraph kernels on CPU use one thread unless OMP_NUM_THREADS says otherwise (Paddle sets it to
    1 when it loads); give them every core, unless the user chose. Call before Paddle is imported."""
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))


# Intel OpenMP (libiomp5) and GNU OpenMP (libgomp), both loaded by Paddle, read these once, when Paddle loads.
# KMP_BLOCKTIME is in milliseconds: 1, not 0. A forward pass is dozens of parallel regions microseconds apart;
# threads that sleep after each of them pay a wake-up per operator (the fast model's one-text call on Paddle
# Inference: 10.2 ms median at 0 against 8.1 ms at 1, a 30-text window 121 against 91 ms, 3 alternated rounds
# on a 2-core Xeon). After the last region of a batch they still sleep within 1 ms.
IDLE_THREAD_DEFAULTS = {"KMP_BLOCKTIME": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def rest_idle_threads() -> None:
    """After each batch Paddle's OpenMP threads spin-wait for the next one (Intel OpenMP: 200 ms by default)
    on the cores the poll loop and the HTTP event loop need; make them sleep 1 ms after their last work
    instead, unless the user chose a wait policy (KMP_BLOCKTIME or OMP_WAIT_POLICY set: both kept as they
    are). For the long-running commands (`run`, `serve`); call before Paddle is imported."""
    if not any(name in os.environ for name in IDLE_THREAD_DEFAULTS):
        os.environ.update(IDLE_THREAD_DEFAULTS)
