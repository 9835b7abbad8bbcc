"""The `sentiment-worker` command line. The runtime never imports this package."""

from worker.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
