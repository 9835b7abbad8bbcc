"""The `sentiment-worker` parser: every command module registers its sub-commands the same way."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from worker.cli import (
    base_model,
    batch_invariance,
    bench,
    compare_backends,
    doctor,
    export,
    int8_ceiling,
    lag,
    model_table,
    predict,
    produce,
    quantize,
    report,
    run,
    serve,
    tail,
    topics,
    train,
    tune,
)
from worker.cli.common import EXIT_FAILED, CommandError, quiet_libraries

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
    export,
    quantize,
    compare_backends,
    int8_ceiling,
    batch_invariance,
    model_table,
    topics,
    doctor,
    lag,
    tune,
    bench,
    report,
)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: each module in COMMAND_MODULES adds its sub-commands."""
    parser = argparse.ArgumentParser(
        prog="sentiment-worker", description="Label a Kafka stream of Chinese reviews with an ERNIE model."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parses `argv`, runs the command; user-fixable errors are one line on stderr with their exit code."""
    args = build_parser().parse_args(argv)
    quiet_libraries()  # before any command imports Paddle
    try:
        return int(args.func(args))
    except CommandError as exc:
        print(f"sentiment-worker {args.command}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - last resort: one clear line, details in the log
        log.error("unexpected failure", exc_info=True)
        print(
            f"sentiment-worker {args.command}: failed: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_FAILED
