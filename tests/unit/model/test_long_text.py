"""Long reviews: layouts (truncate, head_tail, chunk), chunk averaging, and one output per input in order
through the inference stage and the worker's windows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from schemas.dead_letter import DeadLetterKind
from worker.config import WorkerSettings
from worker.inference.classifier import InferenceFailure
from worker.inference.engine import Engine, EngineOptions
from worker.kafka.producer import SourcePosition
from worker.kafka.records import InputMessage
from worker.kafka.windows import DecodeOptions, prepare_window
from worker.labelling.labeller import Labeller
from worker.model.device import choose_device
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier
from worker.model.long_text import (
    SequenceEncoder,
    chunk_layouts,
    chunk_starts,
    head_tail_sizes,
    merge_chunk_outputs,
    single_layout,
)

CLS, SEP = 900, 901


# ----- pure layouts -----
def test_head_tail_keeps_a_quarter_head_and_three_quarters_tail() -> None:
    assert head_tail_sizes(62) == (15, 47)
    assert head_tail_sizes(510) == (127, 383)  # Sun et al. 2019 used 128 + 382
    content = list(range(100))
    ids = single_layout(content, cls_id=CLS, sep_id=SEP, max_seq_len=22, mode="head_tail")
    assert ids == [CLS, *range(5), *range(85, 100), SEP]


def test_truncate_keeps_the_head_and_short_texts_are_untouched() -> None:
    content = list(range(100))
    assert single_layout(content, cls_id=CLS, sep_id=SEP, max_seq_len=22, mode="truncate") == [
        CLS,
        *range(20),
        SEP,
    ]
    for mode in ("truncate", "head_tail", "chunk"):
        assert single_layout([7, 8], cls_id=CLS, sep_id=SEP, max_seq_len=22, mode=mode) == [CLS, 7, 8, SEP]
        assert single_layout([], cls_id=CLS, sep_id=SEP, max_seq_len=22, mode=mode) == [CLS, SEP]


def test_chunk_windows_overlap_by_stride_and_the_last_one_ends_at_the_end() -> None:
    assert chunk_starts(10, window=4, stride=2) == [0, 2, 4, 6]
    assert chunk_starts(11, window=4, stride=3) == [0, 3, 6, 7]
    assert chunk_starts(4, window=4, stride=2) == [0]
    assert chunk_starts(0, window=4, stride=2) == [0]
    chunks = chunk_layouts(list(range(11)), cls_id=CLS, sep_id=SEP, max_seq_len=6, stride=3)
    assert chunks == [
        [CLS, 0, 1, 2, 3, SEP],
        [CLS, 3, 4, 5, 6, SEP],
        [CLS, 6, 7, 8, 9, SEP],
        [CLS, 7, 8, 9, 10, SEP],
    ]


@pytest.mark.parametrize("length", [1, 5, 62, 63, 100, 333, 1000])
@pytest.mark.parametrize("stride", [1, 17, 31, 62])
def test_chunks_cover_every_token_with_full_windows(length: int, stride: int) -> None:
    chunks = chunk_layouts(list(range(length)), cls_id=CLS, sep_id=SEP, max_seq_len=64, stride=stride)
    seen = {token for chunk in chunks for token in chunk[1:-1]}
    assert seen == set(range(length))
    assert all(chunk[0] == CLS and chunk[-1] == SEP and len(chunk) <= 64 for chunk in chunks)
    if length > 62:
        assert all(len(chunk) == 64 for chunk in chunks)


def test_stride_must_fit_the_window() -> None:
    with pytest.raises(ValueError, match="stride"):
        chunk_starts(100, window=10, stride=11)
    with pytest.raises(ValueError, match="chunk_stride_tokens"):
        SequenceEncoder(FakeCharTokenizer(), cls_id=CLS, sep_id=SEP, max_seq_len=12, mode="chunk", stride=11)


def test_merge_averages_windows_and_propagates_a_failure() -> None:
    a, b, c = (np.array(x, dtype=np.float32) for x in ([0.2, 0.8], [0.6, 0.4], [0.9, 0.1]))
    failure = InferenceFailure(DeadLetterKind.INFERENCE_FAILED, "boom")
    merged = merge_chunk_outputs([a, b, c, failure, a], [1, 2, 2])
    assert merged[0] is a  # a single window is passed through untouched
    np.testing.assert_allclose(merged[1], [0.75, 0.25])
    assert merged[1].dtype == np.float32
    assert merged[2] is failure
    with pytest.raises(ValueError, match="outputs"):
        merge_chunk_outputs([a, b], [1, 2])


# ----- the inference stage and the worker's windows, with a fake classifier -----
class FakeCharTokenizer:
    """Content ids = the code point of each character (no vocabulary)."""

    kind = "fake"

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [[ord(ch) for ch in text] for text in texts]


class FakeChunkingClassifier:
    """Chunk mode over FakeCharTokenizer with max_seq_len 6 (4 content ids, stride 2). The 'positive'
    probability of a sequence is its first content id / 1000, so averages can be computed by hand; a
    sequence holding '!' (id 33) fails its batch."""

    labels = ["negative", "positive"]
    call_overhead_tokens = None  # fewest batches
    parallel_calls = 1  # one call at a time

    def __init__(self) -> None:
        self.encoder = SequenceEncoder(
            FakeCharTokenizer(), cls_id=1, sep_id=2, max_seq_len=6, mode="chunk", stride=2
        )
        self.batches: list[int] = []

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return self.encoder.token_ids(texts)

    def token_id_chunks(self, texts: Sequence[str]) -> list[list[list[int]]]:
        return self.encoder.token_id_chunks(texts)

    def predict_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        self.batches.append(len(batch))
        if any(33 in row for row in batch):
            raise ValueError("poisoned window")
        p = np.array([row[1] / 1000.0 if len(row) > 2 else 0.0 for row in batch], dtype=np.float32)
        return np.stack([1 - p, p], axis=1)


def _expected_positive(text: str) -> float:
    """Mean over the text's windows (starts 0, 2, 4, ..., last aligned to the end) of the first id/1000."""
    codes = [ord(ch) for ch in text]
    starts = chunk_starts(len(codes), window=4, stride=2)
    return float(np.mean([codes[s] / 1000.0 for s in starts])) if codes else 0.0


TEXTS = ["abcdefghij", "xy", "", "klmnopq", "d!efghijklmn", "zzzzzzzzzzzzzzzzzzzzzzzzz", "q"]


def test_the_engine_gives_one_averaged_output_per_text_in_order() -> None:
    fake = FakeChunkingClassifier()
    with Engine(fake, EngineOptions(3, 1000)).start(warm_up=False) as engine:
        labelled = engine.submit(TEXTS).result(10)
    outputs, stats = labelled.outputs, labelled.stats
    assert len(outputs) == len(TEXTS)
    for text, output in zip(TEXTS, outputs, strict=True):
        if "!" in text:
            assert isinstance(output, InferenceFailure)  # one failed window fails the whole review
            continue
        assert isinstance(output, np.ndarray)
        assert output[1] == pytest.approx(_expected_positive(text), abs=1e-6)
    assert sum(fake.batches) > len(TEXTS)  # long texts were really split into several sequences
    assert stats.real_tokens > sum(len(t) + 2 for t in TEXTS)


def _message(offset: int, text: str) -> InputMessage:
    value = json.dumps({"id": f"m{offset}", "text": text}).encode()
    return InputMessage(
        SourcePosition(topic="t", partition=0, offset=offset, timestamp_ms=None), b"k", value, 0.0
    )


def test_windows_keep_one_output_per_valid_review_in_input_order() -> None:
    fake = FakeChunkingClassifier()
    settings = WorkerSettings(http_port=0)
    items = [_message(i, text) for i, text in enumerate(TEXTS)]
    s = settings.sections
    prepared = prepare_window(items, DecodeOptions.from_settings(s.registry, s.limits))
    valid = [t for t in TEXTS if t]  # the empty text is dead-lettered by decode, never tokenized
    assert [review.text for review in prepared.reviews] == valid
    with Labeller.of(fake, EngineOptions(4, 1000)).start(warm_up=False) as labeller:
        labelled = labeller.label(prepared.reviews).result(10)
    assert sum(fake.batches) > len(valid)  # long reviews were split into several sequences
    assert len(labelled.outputs) == len(valid)
    for text, output in zip(valid, labelled.outputs, strict=True):
        if "!" in text:
            assert isinstance(output, InferenceFailure)
        else:
            assert isinstance(output, np.ndarray)
            assert output[1] == pytest.approx(_expected_positive(text), abs=1e-6)


# ----- real model: token layouts -----
LONG = "开头很好，" + "中间一般般。" * 30 + "结尾太差了，不推荐！"


@pytest.fixture(scope="module")
def classifiers(tiny_model_dir: Path) -> dict[str, object]:
    cpu = choose_device("cpu")
    return {
        mode: load_classifier(str(tiny_model_dir), cpu, options=InferenceOptions(long_text=mode))  # type: ignore[arg-type]
        for mode in ("truncate", "head_tail", "chunk")
    }


def _content(classifier: object, text: str) -> list[int]:
    tok = classifier.tokenizer  # type: ignore[attr-defined]
    return list(tok.convert_tokens_to_ids(tok.tokenize(text)))


def test_real_layouts_of_a_long_review(classifiers: dict[str, object]) -> None:
    truncate, head_tail, chunk = (classifiers[m] for m in ("truncate", "head_tail", "chunk"))
    tok = truncate.tokenizer  # type: ignore[attr-defined]
    cls, sep = tok.cls_token_id, tok.sep_token_id
    content = _content(truncate, LONG)
    assert len(content) > 62 and truncate.max_seq_len == 64  # type: ignore[attr-defined]
    assert truncate.token_ids([LONG])[0] == [cls, *content[:62], sep]  # type: ignore[attr-defined]
    assert head_tail.token_ids([LONG])[0] == [cls, *content[:15], *content[-47:], sep]  # type: ignore[attr-defined]
    windows = chunk.token_id_chunks([LONG, "很好"])  # type: ignore[attr-defined]
    starts = chunk_starts(len(content), window=62, stride=31)
    assert windows[0] == [[cls, *content[s : s + 62], sep] for s in starts]
    assert windows[1] == [[cls, *_content(chunk, "很好"), sep]]


def test_real_chunk_probabilities_are_the_mean_of_the_windows(classifiers: dict[str, object]) -> None:
    chunk = classifiers["chunk"]
    windows = chunk.token_id_chunks([LONG])[0]  # type: ignore[attr-defined]
    expected = chunk.predict_ids(windows).mean(axis=0)  # type: ignore[attr-defined]
    got = chunk.predict_texts([LONG, "很好"])  # type: ignore[attr-defined]
    assert got.shape == (2, 2) and got.dtype == np.float32
    np.testing.assert_allclose(got[0], expected, atol=1e-6)
    np.testing.assert_allclose(got[1], classifiers["head_tail"].predict_texts(["很好"])[0], atol=1e-6)  # type: ignore[attr-defined]


def test_bad_stride_is_a_load_error(tiny_model_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="chunk_stride_tokens"):
        load_classifier(
            str(tiny_model_dir),
            choose_device("cpu"),
            options=InferenceOptions(long_text="chunk", chunk_stride_tokens=63),
        )
