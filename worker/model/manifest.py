"""The manifest of a model directory: the sha256 of every file in it, written by whatever wrote the directory
(`write_manifest`, the one function `train`, `export`, `quantize`, `calibrate`, `promote`, `adapt` and
`model-manifest` call last) and checked before anything in the directory is deserialized
(`verify_model_dir`). The sha256 of the manifest file itself is the directory's content hash
(`model_content_hash`): what a control record names, and what `doctor` shows.

What the manifest lists: every regular file under the directory, by its path relative to it, except the
manifest itself, `backend_measurement.json` (a machine's speed measurement, written later by
`compare-backends --record`: it only picks among the backends the listed files provide) and the
`checkpoint/` tree (a training run's resumable state, read by `train --resume` only, never by serving).
A directory is refused, with one line saying what to do, when it has no manifest, holds a file the manifest
does not list, lacks one it lists, or holds one whose bytes changed; and whatever its manifest says, when it
holds a pickle (Paddle's `.pdparams` checkpoints and the like run code when they are loaded).

Threat model and limits: docs/model-trust.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from worker.errors import ConfigurationError
from worker.model.backend_choice import MEASUREMENT_FILE

MANIFEST_FILE = "model_manifest.json"
MANIFEST_FORMAT = 1
UNLISTED_FILES = (MANIFEST_FILE, MEASUREMENT_FILE)
TRAINING_STATE_DIR = "checkpoint"
"""A training run's resumable state (Paddle checkpoints, which are pickles): outside the manifest, read only
by the training run that wrote it (`train --resume`), never by serving."""
LEGACY_WEIGHTS_FILE = "model_state.pdparams"
"""PaddleNLP's `save_pretrained` weights: a pickle. Directories written before 2026-12-06 hold it."""
PICKLE_SUFFIXES = (".pdparams", ".pdopt", ".pdstate", ".pdiparams.info", ".pkl", ".pickle", ".pt", ".pth")
"""Files in these formats are Python pickles (Paddle's checkpoints and `jit.save`'s variable info among
them): loading one runs whatever code it names."""
MAX_MANIFEST_BYTES = 1 << 20
MAX_FILES = 10_000
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


class UnverifiedModelError(ConfigurationError):
    """The model directory cannot be verified; nothing in it was deserialized. The message says why and
    what to do."""


@dataclass(frozen=True)
class VerifiedModel:
    """A directory whose files matched its manifest when it was checked."""

    directory: Path
    content_hash: str
    """sha256 (hex) of the manifest file: names and hashes every file of the directory."""
    files: dict[str, str]
    """Relative path -> sha256 (hex) of each listed file."""


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_bytes(files: dict[str, str]) -> bytes:
    """The manifest of `files` as written: deterministic (sorted, ASCII), so the same files always give the
    same content hash."""
    body = {"format": MANIFEST_FORMAT, "sha256": dict(sorted(files.items()))}
    return (json.dumps(body, indent=2, sort_keys=True) + "\n").encode("ascii")


def pickle_files(directory: Path) -> list[str]:
    """The files of `directory` (relative paths, outside `checkpoint/`) whose names say they are pickles."""
    return sorted(name for name in _listed_paths(directory) if name.endswith(PICKLE_SUFFIXES))


def write_manifest(directory: Path) -> str:
    """Hash every file of `directory` into its manifest (written atomically) and return the content hash.
    The one function every writer of a model directory calls last, after its last file is in place. Refuses
    (UnverifiedModelError) a directory holding a pickle: nothing vouches for one."""
    directory = Path(directory)
    _refuse_pickles(directory, writing=True)
    files = {name: file_sha256(directory / name) for name in _listed_paths(directory)}
    data = manifest_bytes(files)
    tmp = directory / f".{MANIFEST_FILE}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, directory / MANIFEST_FILE)
    return hashlib.sha256(data).hexdigest()


def verify_model_dir(directory: Path) -> VerifiedModel:
    """Check `directory` against its manifest before anything in it is read as a model: no pickle, a
    well-formed manifest, exactly the listed files, each with its recorded sha256. Raises
    UnverifiedModelError with one line saying what to do."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UnverifiedModelError(f"model directory {directory} does not exist or is not a directory")
    _refuse_pickles(directory, writing=False)
    raw = _read_manifest(directory)
    listed = _parse_manifest(directory, raw)
    present = set(_listed_paths(directory))
    extra = sorted(present - set(listed))
    if extra:
        raise UnverifiedModelError(
            f"{directory} holds {extra[0]}"
            + (f" (and {len(extra) - 1} more files)" if len(extra) > 1 else "")
            + f", which its {MANIFEST_FILE} does not list, so the directory is not loaded: remove it, or, "
            f"if you trust every file there, run `sentiment-worker model-manifest {directory}` (it vouches "
            "for them)"
        )
    missing = sorted(set(listed) - present)
    if missing:
        raise UnverifiedModelError(
            f"{directory} lacks {missing[0]}, which its {MANIFEST_FILE} lists: the copy is incomplete; copy "
            "the whole directory again from where it was made"
        )
    for name in sorted(listed):
        actual = file_sha256(directory / name)
        if actual != listed[name]:
            raise UnverifiedModelError(
                f"{directory / name} does not match its {MANIFEST_FILE} (sha256 {actual[:12]}…, listed "
                f"{listed[name][:12]}…): it changed after the directory was written; copy the directory "
                "again from where it was made, or re-create it (`train`, `export`, `quantize`)"
            )
    return VerifiedModel(directory, hashlib.sha256(raw).hexdigest(), listed)


def model_content_hash(directory: Path) -> str:
    """The content hash of a verified model directory: sha256 (hex) of its manifest, which names and hashes
    every file. What a control record names beside the directory's path. Raises UnverifiedModelError."""
    return verify_model_dir(directory).content_hash


def _listed_paths(directory: Path) -> list[str]:
    """Relative paths (POSIX) of the files the manifest covers: every file under `directory` except
    UNLISTED_FILES at its top and the `checkpoint/` tree. Refuses what is neither file nor directory."""
    found: list[str] = []
    pending = [(directory, "")]
    while pending:
        folder, prefix = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                name = prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    if name != TRAINING_STATE_DIR:
                        pending.append((Path(entry.path), name + "/"))
                elif entry.is_file(follow_symlinks=True):
                    if name not in UNLISTED_FILES:
                        found.append(name)
                else:
                    raise UnverifiedModelError(
                        f"{entry.path} is neither a file nor a directory (a broken link, a directory link "
                        "or a special file): a model directory holds plain files; remove it"
                    )
                if len(found) > MAX_FILES:
                    raise UnverifiedModelError(f"{directory} holds more than {MAX_FILES} files")
    return sorted(found)


def _refuse_pickles(directory: Path, *, writing: bool) -> None:
    pickles = pickle_files(directory)
    if not pickles:
        return
    name = pickles[0]
    if name == LEGACY_WEIGHTS_FILE:
        fix = (
            f"if you trust that file, convert it with `sentiment-worker model-manifest --convert-pickle "
            f"{directory}` (it loads the pickle once, writes model.safetensors and the manifest)"
        )
    else:
        fix = "delete it (nothing here reads it), or re-create the directory (`export`, `quantize`)"
    doing = "vouch for" if writing else "load"
    raise UnverifiedModelError(
        f"{directory} holds {name}, a pickle (loading one runs the code it names), so it will not "
        f"{doing} this directory: {fix}"
    )


def _read_manifest(directory: Path) -> bytes:
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise UnverifiedModelError(
            f"{directory} has no {MANIFEST_FILE} (the sha256 of each of its files), so it is not loaded: "
            f"if you trust its files, run `sentiment-worker model-manifest {directory}` (it vouches for "
            "them), or re-create it with `sentiment-worker train`, `export` or `quantize`"
        )
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise UnverifiedModelError(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes: not a manifest")
    return path.read_bytes()


def _parse_manifest(directory: Path, raw: bytes) -> dict[str, str]:
    """The manifest's path -> sha256 map; UnverifiedModelError unless it is exactly what write_manifest
    writes (format, a map of safe relative paths to 64 lowercase hex digits)."""
    path = directory / MANIFEST_FILE
    bad = UnverifiedModelError(
        f"{path} is not a valid manifest: re-create the directory, or, if you trust its files, run "
        f"`sentiment-worker model-manifest {directory}`"
    )
    try:
        body = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad from None
    if not isinstance(body, dict) or set(body) != {"format", "sha256"}:
        raise bad
    if body["format"] != MANIFEST_FORMAT or isinstance(body["format"], bool):
        raise bad
    files = body["sha256"]
    if not isinstance(files, dict) or len(files) > MAX_FILES:
        raise bad
    for name, digest in files.items():
        parts = name.split("/")
        if (
            not isinstance(digest, str)
            or not _HEX64.fullmatch(digest)
            or "\\" in name
            or any(part in ("", ".", "..") for part in parts)
            or parts[0] == TRAINING_STATE_DIR
            or name in UNLISTED_FILES
        ):
            raise bad
    return dict(files)
