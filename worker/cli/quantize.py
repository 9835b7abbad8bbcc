"""`sentiment-worker quantize`: INT8 post-training quantization of an ONNX export, with the held-out accuracy
it costs written into the output's model card."""

from __future__ import annotations

import argparse
from pathlib import Path

from worker.cli.common import EXIT_OK, Subparsers
from worker.runtime.logs import configure_logging


def register(subparsers: Subparsers) -> None:
    """Adds `quantize`."""
    parser = subparsers.add_parser(
        "quantize", help="INT8 quantization of an `export --format onnx` directory (accuracy delta measured)"
    )
    parser.add_argument("--model", required=True, type=Path, help="an `export --format onnx` directory")
    parser.add_argument("--output-dir", required=True, type=Path, help="where the INT8 model goes")
    parser.add_argument(
        "--method",
        choices=("ort-static", "ort-dynamic"),
        default="ort-static",
        help="ort-static (default): fixed activation ranges calibrated on corpus reviews, a review's label "
        "does not depend on its batch-mates; ort-dynamic: activations ranged per batch (batch-dependent)",
    )
    parser.add_argument(
        "--weight-bits",
        type=int,
        choices=(7, 8),
        default=7,
        help="7 (default): no saturation on CPUs without VNNI (AVX2); 8: full range, if every CPU has VNNI",
    )
    parser.add_argument(
        "--heldout", type=Path, default=None, help="held-out JSONL (default: the source training directory's)"
    )
    parser.add_argument(
        "--calibration-texts", type=int, default=1000, help="corpus reviews to calibrate on (ort-static)"
    )
    parser.add_argument("--seed", type=int, default=42, help="seed of the calibration sample")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    parser.set_defaults(func=cmd_quantize)


def cmd_quantize(args: argparse.Namespace) -> int:
    from worker.training.quantize import quantize_model

    configure_logging("WARNING")
    report = quantize_model(
        args.model,
        args.output_dir,
        method=args.method,
        weight_bits=args.weight_bits,
        heldout=args.heldout,
        calibration_size=args.calibration_texts,
        seed=args.seed,
        overwrite=args.overwrite,
    )
    acc = report.accuracy
    print(
        f"quantized {args.model} → {report.output_dir} ({report.method}, {report.weight_bits}-bit weights, "
        f"{report.calibration_texts} calibration reviews) in {report.seconds:.1f} s; "
        f"model.onnx {report.source_size_bytes / 1e6:.1f} → {report.size_bytes / 1e6:.1f} MB; "
        f"held-out accuracy {acc.float32:.2%} → {acc.int8:.2%} "
        f"({acc.delta_points:+.2f} points on {acc.texts} reviews, labels agree on {acc.agreement:.2%})"
        + (
            "; labels depend on batch-mates (activations per batch)" if report.method == "ort-dynamic" else ""
        ),
        flush=True,
    )
    return EXIT_OK
