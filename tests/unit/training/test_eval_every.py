"""`train --eval-every N`: dev evaluation every N steps, and each new best written to the output directory at
once, so a run stopped (or killed) mid-way still leaves a usable model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.model_fixtures import MICRO_OPTIONS
from worker.model.device import choose_device
from worker.model.loading import load_classifier
from worker.model.metadata import METADATA_FILE
from worker.training.options import METRICS_FILE, TrainingError, TrainOptions
from worker.training.training import train

MICRO = {**MICRO_OPTIONS, "device": "cpu"}


def test_a_stopped_run_leaves_its_best_model_so_far(tmp_path: Path) -> None:
    lines: list[str] = []
    report = train(
        TrainOptions(output_dir=tmp_path, epochs=2, eval_every=3, stop_after_steps=20, **MICRO),  # type: ignore[arg-type]
        lines.append,
    )
    assert report.interrupted
    evals = [
        line
        for line in lines
        if re.fullmatch(r"step \d+: dev accuracy [01]\.\d{4} macro-F1 [01]\.\d{4}", line)
    ]
    assert [int(line.split()[1].rstrip(":")) for line in evals] == [3, 6, 9, 12, 18]  # 15 ends epoch 1
    assert any(re.match(r"step \d+: new best dev accuracy", line) for line in lines)
    meta = json.loads((tmp_path / METADATA_FILE).read_text("utf-8"))
    assert meta["training"]["interim"] is True and meta["training"]["step"] <= 20
    assert not (tmp_path / METRICS_FILE).exists(), "metrics.json marks a finished run"
    assert not (tmp_path / ".interim.tmp").exists()
    clf = load_classifier(str(tmp_path), choose_device("cpu"))
    assert clf.predict_texts(["很好", "太差了"]).shape == (2, 2)


def test_the_finished_run_keeps_the_best_evaluation_and_resume_may_change_eval_every(tmp_path: Path) -> None:
    lines: list[str] = []
    stopped = train(
        TrainOptions(output_dir=tmp_path, epochs=2, eval_every=4, stop_after_steps=6, **MICRO), lines.append
    )  # type: ignore[arg-type]
    assert stopped.interrupted  # its evaluations count too: the best may come from before the stop
    report = train(
        TrainOptions(output_dir=tmp_path, epochs=2, eval_every=5, resume=True, **MICRO), lines.append
    )  # type: ignore[arg-type]
    assert not report.interrupted and (tmp_path / METRICS_FILE).is_file()
    best = max(float(m.group(1)) for line in lines if (m := re.search(r"dev accuracy ([01]\.\d{4})", line)))
    assert report.dev_accuracy == pytest.approx(best, abs=1e-4)
    meta = json.loads((tmp_path / METADATA_FILE).read_text("utf-8"))
    assert "interim" not in meta["training"]


def test_negative_eval_every_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="eval_every"):
        train(TrainOptions(output_dir=tmp_path, eval_every=-1, **MICRO), lambda _: None)  # type: ignore[arg-type]
