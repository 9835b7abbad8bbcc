"""`sentiment-worker int8-ceiling`: the most INT8 can speed up a model on this CPU (profile share of the
weight multiplications × the INT8/float32 kernel speed-up, Amdahl), beside the measured speed-ups."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from worker.cli.common import EXIT_OK, Subparsers, add_cpu_threads_flag
from worker.errors import ConfigurationError
from worker.runtime.logs import configure_logging
from worker.runtime.process import use_all_cores


def register(subparsers: Subparsers) -> None:
    """Adds `int8-ceiling`."""
    parser = subparsers.add_parser(
        "int8-ceiling",
        help="how much faster INT8 can be than float32 on this CPU, and the measured speed-ups",
    )
    parser.add_argument(
        "--model", required=True, type=Path, help="a float32 ONNX export (`export --format onnx`)"
    )
    parser.add_argument("--int8", required=True, type=Path, help="its INT8 form (`quantize`)")
    parser.add_argument("--texts", type=int, default=512, help="corpus reviews per pass")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timed passes (median reported)")
    add_cpu_threads_flag(parser)
    parser.add_argument("--json", type=Path, default=None, help="also write the report here as JSON")
    parser.set_defaults(func=cmd_int8_ceiling)


def cmd_int8_ceiling(args: argparse.Namespace) -> int:
    from worker.bench.int8_ceiling import CeilingOptions, format_ceiling, int8_ceiling

    configure_logging("WARNING")
    use_all_cores()
    threads = args.cpu_threads or os.cpu_count() or 1
    for directory in (args.model, args.int8):
        if not (directory / "model.onnx").is_file():
            raise ConfigurationError(
                f"{directory} holds no model.onnx: pass an `export --format onnx` or `quantize` output"
            )
    options = CeilingOptions(texts=args.texts, repeats=args.repeats, cpu_threads=threads)
    try:
        report = int8_ceiling(
            args.model, args.int8, options, progress=lambda line: print(line, file=sys.stderr, flush=True)
        )
    except (FileNotFoundError, KeyError) as exc:
        raise ConfigurationError(str(exc)) from None
    print(format_ceiling(report), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report.as_json(), indent=2) + "\n", encoding="utf-8")
    return EXIT_OK
