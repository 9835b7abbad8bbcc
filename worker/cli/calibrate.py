"""`sentiment-worker calibrate`: temperature scaling fitted on the dev split, folded into the weights (truer
confidences, same labels)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from worker.cli.common import EXIT_OK, Subparsers, add_device_flag, settings_for_model
from worker.labelling.loading import load_classifier_for
from worker.runtime.logs import configure_logging
from worker.runtime.process import use_all_cores


def register(subparsers: Subparsers) -> None:
    """Adds `calibrate`."""
    calibrate = subparsers.add_parser(
        "calibrate",
        help="fit a temperature on the dev split, fold it into the weights: truer confidences, same labels",
        description="Temperature scaling: the logits divided by one number T fitted on the dev split the "
        "model was selected on (rebuilt from metrics.json, checked against heldout.jsonl), folded into the "
        "classification layer in place, so every served form derived from the weights inherits it. Prints "
        "the held-out calibration error before and after; run once, after `train` and before `promote`.",
    )
    calibrate.add_argument("--model", required=True, type=Path, help="a directory made by `train`")
    add_device_flag(calibrate)
    calibrate.add_argument("--batch-size", type=int, default=64)
    calibrate.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    use_all_cores()  # before Paddle loads (below)
    from worker.training.evaluate import predict_probs
    from worker.training.temperature import calibrate

    configure_logging("WARNING")

    def predict(directory: Path, texts: Sequence[str]) -> Any:
        sections = settings_for_model(str(directory), args.device, None).sections
        classifier = load_classifier_for(sections.model, sections.batching)
        return predict_probs(classifier, texts, args.batch_size)[0]

    report = calibrate(args.model, predict, lambda line: print(line, flush=True))
    print(f"calibrated {args.model} (version {report.version}): {report.summary()}", flush=True)
    return EXIT_OK
