"""Export the message contracts as JSON Schema files: `python -m schemas.export [--check] [--dir DIR]`.

Each model is written to `<dir>/<name>.v<version>.schema.json` (sorted keys, indent 2, trailing newline).
`--check` writes nothing and exits 1, listing the files that differ from the models (CI and a unit test
use it so the files and the models cannot drift).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel

from schemas.dead_letter import DeadLetterInfo
from schemas.http_api import SentimentRequest, SentimentResponse
from schemas.review_input import ReviewInput
from schemas.sentiment_result import SentimentResult

JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
DEFAULT_DIR: Final = Path(__file__).resolve().parent / "json"

# (model, JSON Schema mode): inputs are described as the worker validates them, outputs as it writes them.
EXPORTED: Final[tuple[tuple[type[BaseModel], Literal["validation", "serialization"]], ...]] = (
    (ReviewInput, "validation"),
    (SentimentResult, "serialization"),
    (DeadLetterInfo, "validation"),
    (SentimentRequest, "validation"),
    (SentimentResponse, "serialization"),
)


def schema_filename(model: type[BaseModel]) -> str:
    """File name of a model's schema: `<SCHEMA_NAME>.v<SCHEMA_VERSION>.schema.json`."""
    name: str = getattr(model, "SCHEMA_NAME")  # noqa: B009 - ClassVar declared on each exported model
    version: int = getattr(model, "SCHEMA_VERSION")  # noqa: B009
    return f"{name}.v{version}.schema.json"


def render_schema(model: type[BaseModel], mode: Literal["validation", "serialization"]) -> str:
    """The exact file contents for one model's JSON Schema."""
    schema: dict[str, Any] = model.model_json_schema(mode=mode, by_alias=True)
    schema["$schema"] = JSON_SCHEMA_DIALECT
    schema["$id"] = schema_filename(model)
    return json.dumps(schema, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def expected_files() -> dict[str, str]:
    """File name → contents for every exported model."""
    return {schema_filename(model): render_schema(model, mode) for model, mode in EXPORTED}


def write_schemas(directory: Path = DEFAULT_DIR) -> list[Path]:
    """Write every schema file into `directory` (created if needed); returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in expected_files().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def drifted_files(directory: Path = DEFAULT_DIR) -> list[Path]:
    """Schema files in `directory` that are missing or differ from the models (older versions are kept)."""
    drifted = []
    for name, text in expected_files().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            drifted.append(path)
    return drifted


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m schemas.export", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the files differ from the models")
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help="output directory (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if args.check:
        drifted = drifted_files(args.dir)
        for path in drifted:
            print(f"drifted: {path} (run `python -m schemas.export`)", file=sys.stderr)
        return 1 if drifted else 0
    for path in write_schemas(args.dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
