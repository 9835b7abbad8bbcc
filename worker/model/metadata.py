"""``sentiment_model.json``: what our own model directories say about themselves, and weight hashing."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

METADATA_FILE = "sentiment_model.json"
WEIGHT_FILES = ("model_state.pdparams", "model.safetensors")
CONFIG_FILES = ("config.json", "model_config.json")
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# PaddleNLP records where the tokenizer was loaded from; meaningless (and private) on another machine.
MACHINE_PATH_KEYS = ("name_or_path", "special_tokens_map_file")


def save_tokenizer(tokenizer: Any, directory: Path) -> None:
    """``tokenizer.save_pretrained(directory)`` without the machine's paths in its tokenizer config."""
    tokenizer.save_pretrained(str(directory))
    drop_machine_paths(directory / TOKENIZER_CONFIG_FILE)


def drop_machine_paths(config: Path) -> None:
    """Removes the keys naming where a tokenizer was loaded from (``MACHINE_PATH_KEYS``) from ``config``."""
    if config.is_file():
        values = json.loads(config.read_text(encoding="utf-8"))
        for key in MACHINE_PATH_KEYS:
            values.pop(key, None)
        config.write_text(json.dumps(values, ensure_ascii=False), encoding="utf-8")


@dataclass(frozen=True)
class ModelMetadata:
    """Name, version (weights hash), label names by id, max_seq_len, creation time, training summary."""

    name: str
    version: str
    labels: list[str]
    max_seq_len: int
    created_at: str
    training: dict[str, Any] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        """Write as pretty JSON."""
        path.write_text(json.dumps(asdict(self), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> ModelMetadata:
        """Parse; raises ValueError naming the problem if fields are missing or of the wrong type."""
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError("top level is not a JSON object")
        try:
            labels = raw["labels"]
            if not (isinstance(labels, list) and labels and all(isinstance(x, str) for x in labels)):
                raise ValueError("labels must be a non-empty list of strings")
            return cls(
                name=str(raw["name"]),
                version=str(raw.get("version", "")),
                labels=list(labels),
                max_seq_len=int(raw["max_seq_len"]),
                created_at=str(raw.get("created_at", "")),
                training=dict(raw.get("training") or {}),
            )
        except KeyError as exc:
            raise ValueError(f"missing field {exc.args[0]!r}") from exc


def find_weights(directory: Path) -> Path | None:
    """The weights file of a ``save_pretrained`` directory, or None."""
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    return None


def weights_version(directory: Path, length: int = 12) -> str:
    """Short sha256 hex digest of the weights file's bytes: the model version of a local directory."""
    weights = find_weights(directory)
    if weights is None:
        raise FileNotFoundError(f"no weights file ({' or '.join(WEIGHT_FILES)}) in {directory}")
    digest = hashlib.sha256()
    with weights.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:length]
