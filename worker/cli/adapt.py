"""`sentiment-worker adapt FILE --output-dir DIR`: the default fine-tuned on a team's own labelled or rated
reviews, gated on their held-out reviews and on the corpus held-out (exit 1 when the gate refuses)."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from worker.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, Subparsers, add_device_flag
from worker.errors import ConfigurationError
from worker.files.review_files import ReviewFile
from worker.runtime.logs import configure_logging
from worker.runtime.process import use_all_cores
from worker.tools.adapt_rows import read_labelled
from worker.training.adapt_labels import LabelRule


def register(subparsers: Subparsers) -> None:
    """Adds `adapt`."""
    parser = subparsers.add_parser(
        "adapt",
        help="adapt the default model to your own labelled or rated reviews (gated: exit 1 if it forgets "
        "or does not gain)",
        description="Splits FILE into train/dev/held-out, fine-tunes --base on the train part with corpus "
        "reviews rehearsed alongside (and a distillation term from the base), calibrates on the dev part, "
        "and reports base vs adapted on your held-out reviews and the corpus held-out. Writes DIR (and "
        "DIR-int8, the served CPU form). See docs/adapt.md.",
    )
    parser.add_argument("file", type=Path, help="a .csv (header row) or .jsonl file of reviews")
    parser.add_argument("--output-dir", type=Path, required=True, help="where the adapted model goes")
    parser.add_argument(
        "--text-field", default=None, help="CSV column / JSON field of the text (default: text)"
    )
    label = parser.add_mutually_exclusive_group()
    label.add_argument(
        "--label-field",
        default=None,
        help="column of the label: 0/1, negative/positive, 负面/正面, 差评/好评 …",
    )
    label.add_argument("--rating-field", default=None, help="column of a star rating (评分), e.g. 1-5")
    parser.add_argument("--negative-max", type=float, default=2.0, help="ratings up to this are negative")
    parser.add_argument("--positive-min", type=float, default=4.0, help="ratings from this are positive")
    parser.add_argument(
        "--skip-bad", action="store_true", help="learn from the good rows, naming each bad one"
    )
    parser.add_argument("--base", type=Path, default=Path("models/default"), help="the model to adapt")
    parser.add_argument("--seed", type=int, default=42, help="seed of the split, samples, order and dropout")
    parser.add_argument("--learning-rate", type=float, default=6e-5, help="peak learning rate")
    parser.add_argument(
        "--rehearsal", type=float, default=1.0, help="corpus reviews rehearsed per user train review (0: off)"
    )
    parser.add_argument(
        "--distill-weight", type=float, default=1.0, help="weight of KL(base‖adapted) on rehearsed reviews"
    )
    parser.add_argument(
        "--corpus-tolerance",
        type=float,
        default=0.02,
        help="early stopping: an evaluation counts only if corpus dev accuracy is within this of the base's",
    )
    parser.add_argument(
        "--select",
        choices=["both", "user"],
        default="both",
        help="early stopping's score: user dev + corpus dev accuracy (both), or the user dev alone",
    )
    parser.add_argument("--no-balance", action="store_true", help="do not weight the loss by class")
    parser.add_argument("--epochs", type=int, default=None, help="default: sized from the data")
    parser.add_argument(
        "--max-minutes", type=float, default=60.0, help="the whole run fits this (the INT8 form aside)"
    )
    parser.add_argument("--micro-batch", type=int, default=None, help="reviews per pass (accumulate to 32)")
    add_device_flag(parser)
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run (same flags)")
    parser.add_argument(
        "--force", action="store_true", help="mark the model promotable though the gate refuses"
    )
    parser.add_argument("--no-int8", action="store_true", help="do not write DIR-int8 (the served CPU form)")
    parser.set_defaults(func=cmd_adapt)


def cmd_adapt(args: argparse.Namespace) -> int:
    use_all_cores()  # before Paddle loads (below)
    from worker.training.adapt import adapt
    from worker.training.adapt_options import AdaptOptions
    from worker.training.adapt_report import table

    configure_logging("WARNING")
    field = args.rating_field or args.label_field or "label"
    try:
        rule = LabelRule(field, args.rating_field is not None, args.negative_max, args.positive_min)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    file = ReviewFile(args.file, text_field=args.text_field)
    rows = read_labelled(file, rule, skip_bad=args.skip_bad)
    for bad in rows.bad:
        print(f"skipped {bad}", file=sys.stderr, flush=True)
    print(rows.describe(file.name, rule), flush=True)
    options = AdaptOptions(
        output_dir=args.output_dir, base=args.base, seed=args.seed, learning_rate=args.learning_rate,
        rehearsal=args.rehearsal, distill_weight=args.distill_weight,
        corpus_tolerance=args.corpus_tolerance, select=args.select, balance=not args.no_balance,
        epochs=args.epochs, max_minutes=args.max_minutes, micro_batch=args.micro_batch, device=args.device,
        resume=args.resume, force=args.force, int8=not args.no_int8,
    )  # fmt: skip
    stop = threading.Event()

    def on_sigint(_signum: int, _frame: FrameType | None) -> None:
        stop.set()  # only a flag: the loop checkpoints after the current step

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        result = adapt(options, rows.examples, progress=lambda line: print(line, flush=True), stop=stop)
    finally:
        signal.signal(signal.SIGINT, previous)
    if result.interrupted:
        argv = [a for a in sys.argv[1:] if a != "--resume"]
        print(
            f"interrupted after step {result.steps}: checkpoint in {args.output_dir}/checkpoint; "
            "continue with\n"
            f"  {shlex.join(['sentiment-worker', *argv, '--resume'])}",
            flush=True,
        )
        return EXIT_INTERRUPTED
    report = result.report
    assert report is not None
    print(table(report), flush=True)
    print(f"report: {args.output_dir}/report.json; {result.seconds / 60:.1f} min", flush=True)
    if report.reasons and not report.forced:
        print(f'{args.output_dir} is marked not promotable (metrics.json "promotable": false)', flush=True)
        return EXIT_FAILED
    if report.forced:
        print("--force: marked promotable although the gate refused it", flush=True)
    return EXIT_OK
