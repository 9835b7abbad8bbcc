"""`sentiment-worker report`: render the dashboard's panels from a recording (made by `record`) into a PNG."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from worker.bench.report import default_window_s, load_recording, render
from worker.cli.common import EXIT_OK, Subparsers


def register(subparsers: Subparsers) -> None:
    """Adds `report`."""
    rep = subparsers.add_parser("report", help="render the dashboard's panels from a recording into a PNG")
    rep.add_argument("recording", type=Path)
    rep.add_argument("--out", type=Path, required=True, help="PNG file")
    rep.add_argument(
        "--window-s", type=float, default=None, help="rate/quantile window (default: 3 scrapes, >= 5 s)"
    )
    rep.add_argument("--title", default="Sentiment worker")
    rep.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    recording = load_recording(args.recording)
    window_s = args.window_s or default_window_s(recording)
    summary = render(recording, args.out, window_s=window_s, title=args.title)
    print(json.dumps({"png": str(args.out), **summary.__dict__}), flush=True)
    return EXIT_OK
