"""`sentiment-worker run`: the worker itself, until stopped (or --max-messages / --idle-exit-s)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from worker.cli.common import (
    EXIT_CONFIG,
    EXIT_OK,
    SETTING_FLAGS,
    Subparsers,
    add_settings_flags,
    settings_from_args,
)
from worker.errors import ConfigurationError, OperationError
from worker.runtime.logs import configure_logging
from worker.runtime.processes import die_with_parent, process_settings, supervise

log = logging.getLogger("worker")


def register(subparsers: Subparsers) -> None:
    """Adds `run`."""
    run = subparsers.add_parser("run", help="consume, label and publish until stopped")
    add_settings_flags(run, *SETTING_FLAGS)
    run.add_argument(
        "--max-messages",
        type=int,
        default=None,
        help="stop after N inputs are done (their result or dead letter acknowledged)",
    )
    run.add_argument("--idle-exit-s", type=float, default=None, help="stop after S seconds without input")
    run.add_argument(
        "--processes",
        type=int,
        default=1,
        help="N worker processes, each a group member with 1/N of the VRAM budget and of the cores, "
        "process i on http_port + i; --max-messages and --idle-exit-s count per process (docs/gpu.md)",
    )
    # Set by the parent of --processes on each child it starts.
    run.add_argument("--process-index", type=int, default=None, help=argparse.SUPPRESS)
    run.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    # The run path loads Paddle: imported here so that `--help` and the light commands start fast.
    from worker.runtime.root import run_worker

    if args.processes < 1:
        raise ConfigurationError(f"--processes must be at least 1, got {args.processes}")
    if args.processes > 1 and args.process_index is None:
        return run_processes(args)
    settings = settings_from_args(args)
    if args.process_index is not None:  # one of the processes of --processes
        die_with_parent(args.parent_pid if args.parent_pid is not None else os.getppid())
        settings = process_settings(settings, args.process_index, args.processes, os.cpu_count() or 1)
    summary = run_worker(settings, max_messages=args.max_messages, idle_exit_s=args.idle_exit_s)
    print(
        json.dumps(
            {
                "stopped": summary.stop_reason,
                "consumed": summary.consumed,
                "results": summary.results,
                "dead_letters": summary.dead_letters,
                "dead_letters_by_kind": summary.dead_letters_by_kind,
                # consumed = results + dead letters + handed back (to the group, uncommitted) + unacknowledged
                "handed_back": summary.handed_back,
                "unacknowledged_at_stop": summary.unacknowledged_at_stop,
                "seconds": round(summary.seconds, 2),
                "labelling_seconds": round(summary.labelling_seconds, 2),
                "busy_seconds": round(summary.busy_seconds, 4),
                "messages_per_second": round(summary.messages_per_second, 1),
            },
            ensure_ascii=False,
        ),
        flush=True,
    )
    return EXIT_OK


def run_processes(args: argparse.Namespace) -> int:
    """`run --processes N`: N `run` processes supervised (worker.runtime.processes); their summaries added up
    are printed; a failed process stopped the others and is the error (its exit code's category)."""
    settings = settings_from_args(args)  # checked once here, and what the plan is logged from
    configure_logging(settings.sections.observability.log_level)
    summary, failure = supervise(settings, args.processes, lambda index: process_command(args, index))
    print(json.dumps(summary, ensure_ascii=False), flush=True)
    if failure is None:
        return EXIT_OK
    error = ConfigurationError if failure.returncode == EXIT_CONFIG else OperationError
    raise error(f"{failure.describe()}; the other processes were stopped")


def process_command(args: argparse.Namespace, index: int) -> list[str]:
    """Process `index`'s command line: this `run`'s own flags, and which process of how many it is."""
    command = [sys.executable, "-m", "worker", "run"]
    if args.config is not None:
        command += ["--config", str(args.config)]
    for name in SETTING_FLAGS:
        if getattr(args, name, None) is not None:
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.max_messages is not None:
        command += ["--max-messages", str(args.max_messages)]
    if args.idle_exit_s is not None:
        command += ["--idle-exit-s", repr(args.idle_exit_s)]
    return command + [
        "--processes", str(args.processes), "--process-index", str(index), "--parent-pid", str(os.getpid())
    ]  # fmt: skip
