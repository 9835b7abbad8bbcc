"""`sentiment-worker tune`: calibrate max_batch_tokens (GPU: VRAM budget; CPU: throughput), cached."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from worker.cli.common import EXIT_OK, Subparsers, add_settings_flags, settings_from_args
from worker.errors import ConfigurationError
from worker.inference.tuning.calibration import DEFAULT_CACHE_DIR
from worker.labelling.loading import load_classifier_for
from worker.runtime.logs import configure_logging


def register(subparsers: Subparsers) -> None:
    """Adds `tune`."""
    tune_parser = subparsers.add_parser(
        "tune", help="calibrate max_batch_tokens: to the VRAM budget on GPU, to throughput on CPU (cached)"
    )
    add_settings_flags(tune_parser, "model", "device")
    tune_parser.add_argument("--vram-budget-mb", type=int, default=None, help="GPU memory inference may use")
    tune_parser.add_argument("--vram-budget-fraction", type=float, default=None, help="share of the GPU")
    tune_parser.add_argument(
        "--safety-margin", type=float, default=None, help="share of the budget kept free"
    )
    tune_parser.add_argument("--latency-bound-ms", type=float, default=None, help="CPU: longest batch")
    tune_parser.add_argument("--cache-dir", type=Path, default=None, help=f"default {DEFAULT_CACHE_DIR}")
    tune_parser.add_argument("--force", action="store_true", help="measure again even if cached")
    tune_parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    tune_parser.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    from worker.inference.tuning import TuneOptions, cache_path, device_description, tune
    from worker.tools.tune import format_report

    s = settings_from_args(args).sections
    log_level = s.observability.log_level
    configure_logging(log_level if log_level != "INFO" else "WARNING")
    classifier = load_classifier_for(s.model, s.batching)
    try:
        options = TuneOptions.from_settings(
            s.batching,
            classifier.max_seq_len,
            vram_budget_mb=args.vram_budget_mb,
            vram_budget_fraction=args.vram_budget_fraction,
            safety_margin=args.safety_margin,
            latency_bound_s=None if args.latency_bound_ms is None else args.latency_bound_ms / 1000.0,
            cache_dir=args.cache_dir,
            use_cache=not args.force,
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    kind, _ = device_description(classifier)
    print(
        "tuning for the VRAM budget (GPU)" if kind == "gpu" else "tuning for CPU throughput, not memory",
        flush=True,
    )
    result = tune(classifier, options, progress=lambda line: print("  " + line, flush=True))
    print(format_report(result), flush=True)
    print(f"cache: {cache_path(options.cache_dir, result.key)}")
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_json(), indent=2, ensure_ascii=False), encoding="utf-8")
    return EXIT_OK
