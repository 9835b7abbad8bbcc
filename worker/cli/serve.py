"""`sentiment-worker serve`: the model over HTTP (`POST /v1/sentiment`, the page at `/`), no Kafka."""

from __future__ import annotations

import argparse
import json

from worker.cli.common import EXIT_OK, Subparsers, add_settings_flags, settings_from_args
from worker.errors import ConfigurationError
from worker.labelling.loading import load_model
from worker.runtime.logs import configure_logging
from worker.runtime.process import (
    freeze_loaded_heap,
    install_stop_handlers,
    name_os_threads,
    rest_idle_threads,
)


def register(subparsers: Subparsers) -> None:
    """Adds `serve`."""
    serve = subparsers.add_parser(
        "serve", help="the model over HTTP: POST /v1/sentiment (batched), a page at /, /metrics, probes"
    )
    add_settings_flags(
        serve, "model", "device", "http_host", "http_port", "backend", "tokenizer", "long_text"
    )
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    # Paddle and uvicorn load here, so that `--help` and the light commands start fast.
    import threading

    from worker.http.serving import SentimentApi

    settings = settings_from_args(args)
    rest_idle_threads()  # before Paddle loads (load_model)
    name_os_threads()  # before the engine and the HTTP server start their threads
    if not settings.http_port:
        raise ConfigurationError("serve needs an HTTP port (SENTIMENT_HTTP_PORT / --http-port, not 0)")
    configure_logging(settings.log_level)
    stop = threading.Event()
    reinstall = install_stop_handlers(stop.set)
    classifier, model_ref = load_model(settings)
    freeze_loaded_heap()
    reinstall()  # loading Paddle replaced them

    def listening(address: tuple[str, int]) -> None:
        print(json.dumps({"listening": f"http://{address[0]}:{address[1]}"}), flush=True)

    service = SentimentApi(settings, classifier, model_ref, stop=stop, on_listening=listening)
    summary = service.run()
    print(json.dumps({"stopped": "stop requested", "seconds": round(summary.seconds, 2)}), flush=True)
    return EXIT_OK
