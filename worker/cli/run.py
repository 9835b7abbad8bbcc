"""`sentiment-worker run`: the worker itself, until stopped (or --max-messages / --idle-exit-s)."""

from __future__ import annotations

import argparse
import json
import threading

from worker.cli.common import (
    EXIT_OK,
    SETTING_FLAGS,
    Subparsers,
    add_settings_flags,
    configure_logging,
    install_stop_handlers,
    load_model,
    name_os_threads,
    rest_idle_threads,
    settings_from_args,
)


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
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    # The run path loads Paddle: imported here so that `--help` and the light commands start fast.
    from worker.http.serving import WorkerApi
    from worker.stream.app import SentimentWorker

    settings = settings_from_args(args)
    rest_idle_threads()  # before Paddle loads (load_model)
    name_os_threads()  # before the engine and the HTTP server start their threads
    configure_logging(settings.log_level)
    stop = threading.Event()
    reinstall = install_stop_handlers(stop.set)  # before the model loads: a signal then stops it at once
    classifier, model_ref = load_model(settings)
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
