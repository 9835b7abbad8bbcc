"""`train --average-best N`: the weights of the N best dev evaluations are kept beside the checkpoint and
averaged at the end; the average becomes the model only when it is not worse on dev."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import paddle

from worker.training.averaging import average_weights, keep_snapshot
from worker.training.checkpoints import LoopState, save_checkpoint, snapshot_path
from worker.training.options import METRICS_FILE, TrainOptions
from worker.training.training import train

MICRO = {
    "num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "max_seq_len": 32,
    "batch_size": 16, "limit": 300, "seed": 3, "device": "cpu",
}  # fmt: skip


def _weights(value: float) -> dict[str, paddle.Tensor]:
    return {
        "w": paddle.full([2, 2], value, dtype="float32"),
        "ids": paddle.to_tensor([[0, 1]], dtype="int64"),
    }


def test_only_the_best_n_snapshots_stay_on_disk(tmp_path: Path) -> None:
    state = LoopState()
    for step, accuracy in [(10, 0.80), (20, 0.85), (30, 0.82), (40, 0.85), (50, 0.70)]:
        state.global_step = step
        keep_snapshot(tmp_path, state, _weights(step), accuracy, keep=3)
    assert [int(s[0]) for s in state.snapshots] == [20, 30, 40]  # sorted by step; 10 and 50 lost on dev
    on_disk = sorted(p.name for p in tmp_path.iterdir())
    assert on_disk == [snapshot_path(tmp_path, s).name for s in (20, 30, 40)]


def test_a_new_checkpoint_links_the_kept_snapshots_instead_of_copying_them(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint"
    model = paddle.nn.Linear(2, 2)
    optimizer = paddle.optimizer.SGD(parameters=model.parameters())
    state = LoopState(global_step=100)
    save_checkpoint(ckpt, model, optimizer, None, state, "fp")
    keep_snapshot(ckpt, state, _weights(1.0), 0.9, keep=3)
    before = snapshot_path(ckpt, 100).stat()
    state.global_step = 200
    save_checkpoint(ckpt, model, optimizer, None, state, "fp")
    after = snapshot_path(ckpt, 100).stat()
    assert (after.st_ino, after.st_nlink) == (before.st_ino, 1)  # the same file, the old directory gone
    assert float(paddle.load(str(snapshot_path(ckpt, 100)))["w"][0, 0]) == 1.0
    assert not ckpt.with_name("checkpoint.tmp").exists()


def test_keep_below_two_keeps_nothing(tmp_path: Path) -> None:
    state = LoopState(global_step=5)
    keep_snapshot(tmp_path, state, _weights(1.0), 0.9, keep=1)
    assert state.snapshots == [] and not any(tmp_path.iterdir())


def test_average_is_the_mean_of_floats_and_keeps_integer_tensors() -> None:
    mean = average_weights([_weights(1.0), _weights(2.0), _weights(6.0)])
    np.testing.assert_allclose(mean["w"].numpy(), np.full((2, 2), 3.0, dtype=np.float32))
    assert mean["w"].dtype == paddle.float32
    assert mean["ids"].numpy().tolist() == [[0, 1]]


def test_a_run_averages_its_best_evaluations_chosen_on_dev(tmp_path: Path) -> None:
    lines: list[str] = []
    options = TrainOptions(output_dir=tmp_path, epochs=2, eval_every=3, average_best=3, **MICRO)  # type: ignore[arg-type]
    report = train(options, lines.append)
    verdicts = [line for line in lines if line.startswith("average of the 3 best dev evaluations")]
    assert len(verdicts) == 1, lines
    used = re.search(r": the (average|best single model) is", verdicts[0])
    assert used is not None
    metrics = json.loads((tmp_path / METRICS_FILE).read_text("utf-8"))
    if used.group(1) == "average":
        assert len(report.averaged_steps) == 3 and metrics["averaged_steps"] == report.averaged_steps
        assert "averaged (chosen on dev)" in (tmp_path / "README.md").read_text("utf-8")
    else:
        assert report.averaged_steps == [] and metrics["averaged_steps"] == []
    assert not (tmp_path / "checkpoint").exists(), "snapshots go with the checkpoint"
