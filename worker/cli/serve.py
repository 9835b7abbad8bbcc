"""`sentiment-worker serve`: the model over HTTP (`POST /v1/sentiment`, the page at `/`), no Kafka."""

from __future__ import annotations

import argparse
import json

from worker.cli.common import EXIT_OK, Subparsers, add_settings_flags, settings_from_args
from worker.errors import ConfigurationError


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
    from worker.runtime.root import serve

    settings = settings_from_args(args)
    if not settings.sections.http.http_port:
        raise ConfigurationError("serve needs an HTTP port (SENTIMENT_HTTP_PORT / --http-port, not 0)")

    def listening(address: tuple[str, int]) -> None:
        print(json.dumps({"listening": f"http://{address[0]}:{address[1]}"}), flush=True)

    summary = serve(settings, on_listening=listening)
    print(json.dumps({"stopped": "stop requested", "seconds": round(summary.seconds, 2)}), flush=True)
    return EXIT_OK
