"""Process start-up shared by the long-running commands (`run`, `serve`, and `predict`/`bench` where they
load a model): the model threads' idle policy, the cores Paddle may use, thread names in the kernel, the stop
handlers and the heap policy after loading."""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("worker")

__all__ = [
    "IDLE_THREAD_DEFAULTS",
    "STOP_GRACE_S",
    "freeze_loaded_heap",
    "install_stop_handlers",
    "name_os_threads",
    "release_heap",
    "rest_idle_threads",
    "use_all_cores",
]


def freeze_loaded_heap() -> None:
    """After the one model of a long-running command is loaded: collects, then moves every object alive
    (Paddle's and PaddleNLP's modules, the model, the tokenizer: millions of objects that live as long as the
    process) out of the garbage collector's reach (`gc.freeze`). Its collections then scan only what the run
    allocates. Without this each full collection walks the whole loaded heap on the poll thread: the worker on
    the identity model drained 18,900–19,800 msg/s with 33.7 µs of poll-thread CPU a review, and 32,200–34,900
    with 19.1 µs once frozen (2-core EPYC). Objects frozen are never freed, so a command that loads several
    models one after the other does not call this; a long-running one that replaces its model calls
    `release_heap` after the old one is closed."""
    gc.collect()
    gc.freeze()


def release_heap() -> None:
    """After a replaced model was closed and dropped: the frozen heap back under the collector, collected (the
    old model's objects, frozen with the rest when it was loaded, are freed now), and frozen again."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


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
        os._exit(1)  # exit code 1: failed while running

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
