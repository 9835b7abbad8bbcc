"""`sentiment-worker run`: the worker itself, until stopped (or --max-messages / --idle-exit-s)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

from worker.cli.common import (
    EXIT_CONFIG,
    EXIT_OK,
    SETTING_FLAGS,
    Subparsers,
    add_settings_flags,
    configure_logging,
    freeze_loaded_heap,
    install_stop_handlers,
    load_model,
    name_os_threads,
    rest_idle_threads,
    settings_from_args,
)
from worker.errors import ConfigurationError, OperationError
from worker.tools.processes import (
    Supervisor,
    combine_summaries,
    die_with_parent,
    plan_lines,
    process_settings,
)

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
    from worker.http.serving import WorkerApi
    from worker.stream.app import SentimentWorker

    if args.processes < 1:
        raise ConfigurationError(f"--processes must be at least 1, got {args.processes}")
    if args.processes > 1 and args.process_index is None:
        return run_processes(args)
    settings = settings_from_args(args)
    if args.process_index is not None:  # one of the processes of --processes
        die_with_parent(args.parent_pid if args.parent_pid is not None else os.getppid())
        settings = process_settings(settings, args.process_index, args.processes, os.cpu_count() or 1)
    rest_idle_threads()  # before Paddle loads (load_model)
    name_os_threads()  # before the engine and the HTTP server start their threads
    configure_logging(settings.log_level)
    stop = threading.Event()
    # Before the model loads: a signal then stops it at once.
    reinstall = install_stop_handlers(stop.set, stop_timeout_s=settings.shutdown_timeout_s)
    classifier, model_ref = load_model(settings)
    freeze_loaded_heap()
    reinstall()  # loading Paddle replaced them
    api = WorkerApi() if settings.http_api else None  # the API on the worker's port, when asked for
    worker = SentimentWorker(settings, classifier, model_ref, stop=stop, api=api)
    summary = worker.run(max_messages=args.max_messages, idle_exit_s=args.idle_exit_s)
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
    """`run --processes N`: starts N `run` processes, forwards SIGTERM/SIGINT to them, prints their summaries
    added up; a failed process stops the others and is the error (its exit code's category)."""
    settings = settings_from_args(args)  # checked once here, and what the plan is logged from
    configure_logging(settings.log_level)
    log.info("%d worker processes, each its own member of group %s:", args.processes, settings.group_id)
    for line in plan_lines(settings, args.processes, os.cpu_count() or 1):
        log.info("  %s", line)
    supervisor = Supervisor(
        lambda index: process_command(args, index), args.processes, kill_after_s=settings.shutdown_timeout_s
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: supervisor.forward(received))
    failure = supervisor.run()
    print(json.dumps(combine_summaries(supervisor.summaries), ensure_ascii=False), flush=True)
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
