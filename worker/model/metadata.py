"""``sentiment_model.json``: what our own model directories say about themselves, and weight hashing."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

METADATA_FILE = "sentiment_model.json"
WEIGHTS_FILE = "model.safetensors"
"""The weights of a training directory (worker.model.weights): safetensors, data only, never a pickle."""
WEIGHT_FILES = (WEIGHTS_FILE,)
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
        """Parse; raises ValueError naming the key at fault if a field is missing, null or of the wrong type,
        or the label names are not distinct non-empty strings."""
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError("top level is not a JSON object")
        for key in ("name", "labels", "max_seq_len"):
            if key not in raw:
                raise ValueError(f"missing field {key!r}")
        return cls(
            name=_text(raw, "name", required=True),
            version=_text(raw, "version"),
            labels=_labels(raw.get("labels")),
            max_seq_len=_max_seq_len(raw.get("max_seq_len")),
            created_at=_text(raw, "created_at"),
            training=_section(raw, "training"),
        )


MIN_SEQ_LEN = 3
"""[CLS], one token, [SEP]."""


def _shown(value: object) -> str:
    """A JSON value as the file holds it, shortened for a message."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _text(raw: dict[str, Any], key: str, *, required: bool = False) -> str:
    """A string field; absent (when optional) is ""."""
    value = raw.get(key, None if required else "")
    if not isinstance(value, str) or (required and not value.strip()):
        kind = "a non-empty string" if required else "a string"
        raise ValueError(f"{key!r} must be {kind}, not {_shown(value)}")
    return value


def _labels(value: object) -> list[str]:
    """Label names by id: distinct, non-empty strings (a result names its label by them)."""
    if not (isinstance(value, list) and value and all(isinstance(x, str) and x.strip() for x in value)):
        raise ValueError(f"'labels' must be a non-empty list of non-empty strings, not {_shown(value)}")
    repeated = sorted({x for x in value if value.count(x) > 1})
    if repeated:
        raise ValueError(f"'labels' names {', '.join(map(repr, repeated))} more than once: {_shown(value)}")
    return list(value)


def _max_seq_len(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_SEQ_LEN:
        raise ValueError(f"'max_seq_len' must be an integer >= {MIN_SEQ_LEN}, not {_shown(value)}")
    return value


def _section(raw: dict[str, Any], key: str) -> dict[str, Any]:
    """An optional object field; absent or null is {}."""
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{key!r} must be a JSON object, not {_shown(value)}")
    return dict(value)


def find_weights(directory: Path) -> Path | None:
    """The weights file (model.safetensors) of a training directory, or None."""
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
