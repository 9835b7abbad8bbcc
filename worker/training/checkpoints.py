"""Checkpoints for --resume: the model, optimizer (and AMP scaler) state and the loop position, written
aside and swapped in; refused on resume when the options differ."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from worker.training.options import TrainingError

SNAPSHOT_GLOB = "dev-step-*.pdparams"


def snapshot_path(ckpt: Path, step: int) -> Path:
    """Where the weights evaluated on dev at ``step`` are kept for averaging."""
    return ckpt / f"dev-step-{step:06d}.pdparams"


@dataclass
class LoopState:
    """Loop state saved with each checkpoint."""

    global_step: int = 0
    epoch: int = 1
    step_in_epoch: int = 0
    best_dev: float = -1.0
    best_epoch: int = 0
    best_step: int = 0
    bad_epochs: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    epoch_loss_sum: float = 0.0
    epoch_loss_steps: int = 0
    epoch_seconds: float = 0.0
    train_seconds: float = 0.0
    seen: int = 0
    snapshots: list[list[float]] = field(default_factory=list)
    """``[step, dev accuracy]`` of each weight snapshot kept for averaging (``--average-best``)."""


def save_checkpoint(
    ckpt: Path, model: Any, optimizer: Any, scaler: Any, state: LoopState, fingerprint: str
) -> None:
    """Atomically enough: write into a temp dir, then swap it in."""
    import paddle

    tmp = ckpt.with_name(ckpt.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    paddle.save(unwrap(model).state_dict(), str(tmp / "model.pdparams"))
    paddle.save(optimizer.state_dict(), str(tmp / "optimizer.pdopt"))
    if scaler is not None:
        paddle.save(scaler.state_dict(), str(tmp / "scaler.pdstate"))
    if (ckpt / "best.pdparams").exists():
        _carry_over(ckpt / "best.pdparams", tmp / "best.pdparams")
    for snapshot in ckpt.glob(SNAPSHOT_GLOB) if ckpt.exists() else ():
        _carry_over(snapshot, tmp / snapshot.name)
    (tmp / "state.json").write_text(
        json.dumps({"fingerprint": fingerprint, **asdict(state)}, indent=2) + "\n", encoding="utf-8"
    )
    if ckpt.exists():
        shutil.rmtree(ckpt)
    tmp.rename(ckpt)


def _carry_over(source: Path, target: Path) -> None:
    """Puts an unchanged file of the old checkpoint into the new one: a hard link (no 96 MB copy per snapshot
    per checkpoint; the old directory is removed right after), a copy where the filesystem has no links."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def load_checkpoint(
    ckpt: Path, model: Any, optimizer: Any, scaler: Any, fingerprints: Collection[str]
) -> LoopState:
    """The loop state of the checkpoint in `ckpt`, its weights loaded into `model`, `optimizer` and `scaler`;
    refused unless it carries one of `fingerprints` (the same options)."""
    import paddle

    tmp = ckpt.with_name(ckpt.name + ".tmp")
    if not ckpt.exists() and (tmp / "state.json").is_file():
        # killed between removing the old checkpoint and renaming the new one in: the new one is whole
        # (state.json is its last file), so it is the checkpoint
        tmp.rename(ckpt)
    state_file = ckpt / "state.json"
    if not state_file.is_file():
        raise TrainingError(f"--resume: no checkpoint at {ckpt} (nothing to resume; drop --resume)")
    raw = json.loads(state_file.read_text(encoding="utf-8"))
    if raw.pop("fingerprint", None) not in fingerprints:
        raise TrainingError(
            f"--resume: the checkpoint in {ckpt} was made with different options; resume with the same "
            "data, model and hyper-parameter flags, or start over without --resume"
        )
    unwrap(model).set_state_dict(paddle.load(str(ckpt / "model.pdparams")))
    optimizer.set_state_dict(paddle.load(str(ckpt / "optimizer.pdopt")))
    if scaler is not None and (ckpt / "scaler.pdstate").exists():
        scaler.load_state_dict(paddle.load(str(ckpt / "scaler.pdstate")))
    return LoopState(**raw)


def unwrap(model: Any) -> Any:
    return getattr(model, "_layers", model)
