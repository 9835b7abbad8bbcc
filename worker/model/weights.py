"""Model weights as data: ``model.safetensors`` (a JSON header and raw tensor bytes; reading it runs no code),
the one format our model directories hold, and the ERNIE classifier built from it.

`save_classifier` is the one way a dygraph model becomes a directory (config.json, model.safetensors, the
tokenizer files): `train`, `promote` and `adapt` write through it, then `write_manifest`
(worker.model.manifest). `build_classifier` is the one way back: from a directory verified against its
manifest, the weights read from the very bytes that were hashed. PaddleNLP's ``save_pretrained`` /
``from_pretrained`` are not used on our directories: their ``model_state.pdparams`` is a pickle.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from worker.model.manifest import LEGACY_WEIGHTS_FILE, UnverifiedModelError, VerifiedModel, file_sha256
from worker.model.metadata import METADATA_FILE, WEIGHTS_FILE, save_tokenizer, weights_version

FRESH_ON_INIT = ("ernie.pooler.", "classifier.")
"""Weights a pretrained encoder may lack when it is loaded to be fine-tuned (they start fresh)."""
ENCODER_PREFIX = "ernie."
FILE_MODE = 0o644
"""safetensors creates its files private (0600); a model directory is read by other users (a container's)."""


class WeightsError(UnverifiedModelError):
    """The weights do not fit the model their config.json describes; the message says what to do."""


def as_numpy(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A state dict (Paddle tensors or numpy arrays) as contiguous numpy arrays, same dtypes."""
    return {
        name: np.ascontiguousarray(value.numpy() if hasattr(value, "numpy") else np.asarray(value))
        for name, value in state.items()
    }


def save_weights(state: Mapping[str, Any], directory: Path) -> Path:
    """Write ``state`` (name -> tensor or array) to ``directory/model.safetensors`` atomically, each tensor
    in its own dtype; remove a ``model_state.pdparams`` it supersedes. Returns the path."""
    from safetensors.numpy import save_file

    path = Path(directory) / WEIGHTS_FILE
    tmp = path.with_name(f".{WEIGHTS_FILE}.{os.getpid()}.tmp")
    save_file(as_numpy(state), str(tmp))
    os.chmod(tmp, FILE_MODE)
    os.replace(tmp, path)
    (path.parent / LEGACY_WEIGHTS_FILE).unlink(missing_ok=True)
    return path


def read_weights(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file, as numpy arrays (data only: nothing in the file is executed)."""
    return _parsed(Path(path), Path(path).read_bytes())


def read_verified_weights(verified: VerifiedModel) -> dict[str, np.ndarray]:
    """The weights of a verified directory, parsed from the bytes whose sha256 is checked here against the
    manifest (so a file swapped after verification is refused, not loaded)."""
    path = verified.directory / WEIGHTS_FILE
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != verified.files.get(WEIGHTS_FILE):
        raise UnverifiedModelError(
            f"{path} changed after its directory was verified (or is not in its manifest): copy the "
            "directory again from where it was made"
        )
    return _parsed(path, data)


def _parsed(path: Path, data: bytes) -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    try:
        return load(data)
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a bad header
        raise WeightsError(
            f"{path} is not a readable safetensors file ({type(exc).__name__}: {exc}); re-create the "
            "directory (`sentiment-worker train`)"
        ) from None


def save_classifier(net: Any, tokenizer: Any, directory: Path) -> None:
    """A dygraph ERNIE classifier and its tokenizer into ``directory``: config.json (architectures named),
    model.safetensors, the tokenizer files. Whoever calls it writes the manifest after its last file."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(net.config)
    config.architectures = [type(net).__name__]
    config.save_pretrained(str(directory))
    save_weights(net.state_dict(), directory)
    save_tokenizer(tokenizer, directory)


def build_classifier(verified: VerifiedModel, *, init: bool = False, num_labels: int | None = None) -> Any:
    """``ErnieForSequenceClassification`` from a verified directory's config.json and model.safetensors,
    float32, in eval mode. Every weight of the model must be in the file, with its shape, and nothing else,
    unless ``init`` (a pretrained encoder to fine-tune): then the encoder's weights may be stored without
    the ``ernie.`` prefix, and the pooler and classifier may be missing (they start fresh)."""
    from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification

    overrides = {} if num_labels is None else {"num_labels": num_labels}
    config = ErnieConfig.from_pretrained(str(verified.directory), **overrides)
    net = ErnieForSequenceClassification(config)
    saved = read_verified_weights(verified)
    if init:
        saved = {_encoder_name(name): tensor for name, tensor in saved.items()}
    expected = net.state_dict()
    path = verified.directory / WEIGHTS_FILE
    absent = sorted(set(expected) - set(saved))
    if init:
        absent = [name for name in absent if not name.startswith(FRESH_ON_INIT)]
    unknown = sorted(set(saved) - set(expected))
    if absent or unknown:
        what = (
            [f"lacks {len(absent)} of the model's {len(expected)} weights (e.g. {absent[0]})"]
            if absent
            else []
        )
        what += [f"holds weights the model has not ({unknown[0]})"] if unknown else []
        raise WeightsError(
            f"{path} {' and '.join(what)}: it was not saved from the ErnieForSequenceClassification its "
            "config.json describes; re-create the directory (`sentiment-worker train`)"
        )
    state = {}
    for name, array in saved.items():
        shape = tuple(expected[name].shape)
        if tuple(array.shape) != shape:
            raise WeightsError(f"{path}: {name} is {tuple(array.shape)}, the model's is {shape}")
        state[name] = array.astype(np.float32) if array.dtype.kind == "f" else array
    net.set_state_dict(state)
    net.eval()
    return net


def _encoder_name(name: str) -> str:
    """A pretrained encoder's weight by the classifier's name (``embeddings.x``: ``ernie.embeddings.x``)."""
    return name if name.startswith((ENCODER_PREFIX, "classifier.")) else ENCODER_PREFIX + name


def load_tokenizer(directory: Path) -> Any:
    """PaddleNLP's ErnieTokenizer from a (verified) directory's vocab.txt and tokenizer JSON files."""
    from paddlenlp.transformers import ErnieTokenizer

    return ErnieTokenizer.from_pretrained(str(directory))


def convert_pickled_weights(directory: Path) -> tuple[Path, int]:
    """``model_state.pdparams`` -> ``model.safetensors`` (the same tensors, dtypes and values; the pickle is
    removed; sentiment_model.json's version, when it was the pickle's hash, becomes the new file's).
    Unpickles the file, which runs whatever code it names: only for a file the operator trusts
    (`sentiment-worker model-manifest --convert-pickle`). Returns the new file and its tensor count."""
    import paddle
    from safetensors.numpy import save_file

    directory = Path(directory)
    source = directory / LEGACY_WEIGHTS_FILE
    old_version = file_sha256(source)[:12]
    state = as_numpy(paddle.load(str(source), return_numpy=True))
    tmp = directory / f".{WEIGHTS_FILE}.converting"
    save_file(state, str(tmp))
    os.chmod(tmp, FILE_MODE)
    again = read_weights(tmp)
    if set(again) != set(state) or any(
        again[k].dtype != v.dtype or not np.array_equal(again[k], v) for k, v in state.items()
    ):
        tmp.unlink(missing_ok=True)
        raise WeightsError(f"{tmp} does not read back as {source}'s tensors: nothing converted")
    os.replace(tmp, directory / WEIGHTS_FILE)
    source.unlink()
    meta = directory / METADATA_FILE
    if meta.is_file():
        data = json.loads(meta.read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("version") == old_version:
            data["version"] = weights_version(directory)
            meta.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return directory / WEIGHTS_FILE, len(state)
