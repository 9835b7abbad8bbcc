"""`sentiment-worker batch-invariance`: each held-out review labelled alone and inside mixed batches by a
served form; exit 1 when a label changes or a probability moves more than the tolerance."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from worker.cli.common import EXIT_FAILED, EXIT_OK, Subparsers, add_model_dirs_flag
from worker.errors import ConfigurationError
from worker.runtime.logs import configure_logging


def register(subparsers: Subparsers) -> None:
    """Adds `batch-invariance`."""
    parser = subparsers.add_parser(
        "batch-invariance",
        help="do a served form's labels depend on batch-mates? (each review alone vs in mixed batches)",
    )
    add_model_dirs_flag(parser, "a served model directory")
    parser.add_argument(
        "--heldout",
        required=True,
        type=Path,
        help="the reviews to label (a heldout.jsonl from `train`, e.g. models/default/heldout.jsonl)",
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N reviews (default: all)")
    parser.add_argument("--batch-size", type=int, default=32, help="reviews per mixed batch")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffle that mixes the lengths")
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="largest allowed probability move (default 1e-4)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here as JSON")
    parser.set_defaults(func=cmd_batch_invariance)


def cmd_batch_invariance(args: argparse.Namespace) -> int:
    from worker.bench.batch_invariance import batch_invariance, format_batch_invariance
    from worker.model.device import choose_device
    from worker.model.loading import load_classifier
    from worker.training.evaluate import read_heldout

    configure_logging("WARNING")
    if not args.heldout.is_file():
        raise ConfigurationError(
            f"held-out file {args.heldout} does not exist: pass a heldout.jsonl from `train`"
        )
    texts = [example.text for example in read_heldout(args.heldout)][: args.limit]
    results = {}
    for directory in args.model:
        print(f"{directory}: {len(texts)} reviews alone, then in mixed batches", file=sys.stderr, flush=True)
        try:
            classifier = load_classifier(str(directory), choose_device("cpu"))
            result = batch_invariance(
                classifier, texts, batch_size=args.batch_size, seed=args.seed, tolerance=args.tolerance
            )
        except ValueError as exc:  # a ModelLoadError maps to its exit code in main
            raise ConfigurationError(f"{directory}: {exc}") from None
        results[str(directory)] = result
        print(format_batch_invariance(str(directory), result), flush=True)
    if args.json is not None:
        payload = {model: result.as_json() for model, result in results.items()}
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return EXIT_OK if all(result.invariant for result in results.values()) else EXIT_FAILED
