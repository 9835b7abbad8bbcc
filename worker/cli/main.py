"""The `sentiment-worker` parser (every command module registers its sub-commands the same way) and the one
place where a failure becomes an exit code."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys
from collections.abc import Sequence

from worker.cli import (
    adapt,
    base_model,
    batch_invariance,
    bench,
    calibrate,
    compare_backends,
    doctor,
    evaluate,
    export,
    inference_speed,
    int8_ceiling,
    lag,
    model_manifest,
    model_table,
    models,
    predict,
    produce,
    promote,
    quantize,
    record,
    report,
    run,
    serve,
    tail,
    topics,
    train,
    tune,
)
from worker.cli.common import EXIT_CLOSED_PIPE, EXIT_CONFIG, EXIT_FAILED, EXIT_INTERRUPTED
from worker.errors import ConfigurationError, OperationError, WorkerError
from worker.runtime.logs import quiet_libraries

log = logging.getLogger("worker")

# In the order `--help` lists them.
COMMAND_MODULES = (
    run,
    serve,
    produce,
    tail,
    predict,
    base_model,
    train,
    adapt,
    evaluate,
    promote,
    models,
    calibrate,
    export,
    inference_speed,
    quantize,
    compare_backends,
    int8_ceiling,
    batch_invariance,
    model_table,
    model_manifest,
    topics,
    doctor,
    lag,
    tune,
    bench,
    record,
    report,
)


def _version() -> str:
    """The installed package's version (pyproject.toml), or "unknown" when it is run from a bare checkout."""
    try:
        return importlib.metadata.version("sentiment-worker")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: each module in COMMAND_MODULES adds its sub-commands."""
    parser = argparse.ArgumentParser(
        prog="sentiment-worker", description="Label a Kafka stream of Chinese reviews with an ERNIE model."
    )
    parser.add_argument("--version", action="version", version=f"sentiment-worker {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


# The exit code of each category of the project's errors (worker.errors; README "Exit codes").
EXIT_CODES: dict[type[WorkerError], int] = {ConfigurationError: EXIT_CONFIG, OperationError: EXIT_FAILED}


def exit_code(error: WorkerError) -> int:
    """The exit code of `error`'s category (an error of none counts as failed while running)."""
    return next((code for kind, code in EXIT_CODES.items() if isinstance(error, kind)), EXIT_FAILED)


def main(argv: Sequence[str] | None = None) -> int:
    """Parses `argv`, runs the command; the project's errors are one line on stderr and their category's
    exit code, an interrupt is 130, a closed stdout pipe 141 without a word, anything else a bug (one line,
    the traceback in the log, exit 1)."""
    args = build_parser().parse_args(argv)
    quiet_libraries()  # before any command imports Paddle
    try:
        return int(args.func(args))
    except WorkerError as exc:
        print(f"sentiment-worker {args.command}: error: {exc}", file=sys.stderr, flush=True)
        return exit_code(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader closed the pipe (`| head`): stop quietly. stdout goes to /dev/null so that the flush at
        # interpreter exit does not raise again (Python's own advice for SIGPIPE).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    except Exception as exc:  # noqa: BLE001 - last resort: one clear line, details in the log
        log.error("unexpected failure", exc_info=True)
        print(
            f"sentiment-worker {args.command}: failed: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_FAILED
