"""`sentiment-worker model-manifest`: check a model directory against its manifest and print its content hash,
or write the manifest of a directory the operator trusts (optionally converting its pickled weights first)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from worker.cli.common import EXIT_OK, Subparsers
from worker.runtime.logs import configure_logging

VOUCH_WARNING = (
    "WARNING: writing a manifest vouches for every file in {directory} as it is now: every worker that "
    "loads the directory will trust them. Do this only for a directory you made or copied from where it "
    "was made; a directory that came from anyone else is re-created with `train`, `export`, `quantize`."
)
UNPICKLE_WARNING = (
    "WARNING: --convert-pickle loads {path}, a pickle: whatever code it names runs now, with your "
    "rights. Only for a file you trust."
)


def register(subparsers: Subparsers) -> None:
    """Adds `model-manifest`."""
    parser = subparsers.add_parser(
        "model-manifest",
        help="check a model directory against its manifest (--check), or write the manifest of one you trust",
        description="Every model directory carries model_manifest.json, the sha256 of each of its files, "
        "written by train, export, quantize, calibrate and promote; workers load a directory only when its "
        "files match it. --check verifies a directory and prints its content hash (the sha256 of the "
        "manifest: what a control record names). Without --check, writes the manifest of DIR as it is: "
        "for a directory you trust that has none (made before manifests, or edited by hand). "
        "--convert-pickle first converts a model_state.pdparams (a pickle) to model.safetensors.",
    )
    parser.add_argument("directory", type=Path, help="the model directory")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="verify only; exit 2 when the directory fails")
    mode.add_argument(
        "--convert-pickle",
        action="store_true",
        help="convert model_state.pdparams to model.safetensors first (unpickles it: a file you trust only)",
    )
    parser.set_defaults(func=cmd_model_manifest)


def cmd_model_manifest(args: argparse.Namespace) -> int:
    from worker.errors import ConfigurationError
    from worker.model.manifest import LEGACY_WEIGHTS_FILE, model_content_hash, write_manifest

    configure_logging("WARNING")
    directory: Path = args.directory.expanduser()
    if args.check:
        print(f"{directory}: verified, content sha256 {model_content_hash(directory)}", flush=True)
        return EXIT_OK
    if not directory.is_dir():
        raise ConfigurationError(f"{directory} is not a directory")
    if args.convert_pickle:
        pickled = directory / LEGACY_WEIGHTS_FILE
        if not pickled.is_file():
            raise ConfigurationError(f"{directory} holds no {LEGACY_WEIGHTS_FILE} to convert")
        print(UNPICKLE_WARNING.format(path=pickled), file=sys.stderr, flush=True)
        from worker.model.weights import convert_pickled_weights

        converted, tensors = convert_pickled_weights(directory)
        print(f"converted {pickled.name} → {converted.name} ({tensors} tensors, same values)", flush=True)
    print(VOUCH_WARNING.format(directory=directory), file=sys.stderr, flush=True)
    content = write_manifest(directory)
    print(f"{directory}: manifest written, content sha256 {content}", flush=True)
    return EXIT_OK
