"""`sentiment-worker export`: a training directory to a static Paddle Inference model, or with `--format onnx`
static + ONNX, each parity-checked against the dynamic model."""

from __future__ import annotations

import argparse
from pathlib import Path

from worker.cli.common import EXIT_OK, Subparsers
from worker.runtime.logs import configure_logging


def register(subparsers: Subparsers) -> None:
    """Adds `export`."""
    export = subparsers.add_parser(
        "export", help="export a trained model directory to a static Paddle Inference model directory"
    )
    export.add_argument(
        "--model", required=True, type=Path, help="training directory (model.safetensors and its manifest)"
    )
    export.add_argument("--output-dir", required=True, type=Path, help="where the exported model goes")
    export.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    export.add_argument(
        "--format",
        choices=("paddle", "onnx"),
        default="paddle",
        help="paddle: Paddle Inference (static backend); onnx: also model.onnx (onnx backend), both checked",
    )
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from worker.training.export import export_model

    configure_logging("WARNING")
    if args.format == "onnx":
        return export_onnx_format(args)
    report = export_model(args.model, args.output_dir, overwrite=args.overwrite)
    print(
        f"exported {args.model} → {report.output_dir} ({report.graph_file.name}) in {report.seconds:.1f} s; "
        f"static vs dynamic max |Δp| {report.max_abs_diff:.1e} on {report.probe_texts} probe texts",
        flush=True,
    )
    return EXIT_OK


def export_onnx_format(args: argparse.Namespace) -> int:
    from worker.training.onnx_export import export_onnx

    report = export_onnx(args.model, args.output_dir, overwrite=args.overwrite)
    print(
        f"exported {args.model} → {report.output_dir} (Paddle static + {report.onnx_file.name}) in "
        f"{report.seconds:.1f} s; max |Δp| vs dynamic: static {report.static_max_abs_diff:.1e}, "
        f"onnx {report.onnx_max_abs_diff:.1e} on {report.probe_texts} probe texts",
        flush=True,
    )
    return EXIT_OK
