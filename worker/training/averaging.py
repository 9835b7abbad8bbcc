"""Checkpoint averaging (``train --average-best N``): the weights of the N dev evaluations with the best
accuracy are kept beside the checkpoint and averaged at the end; the average is chosen on dev only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from worker.training.checkpoints import LoopState, snapshot_path


def keep_snapshot(ckpt: Path, state: LoopState, weights: dict[str, Any], accuracy: float, keep: int) -> None:
    """Remember the weights just evaluated on dev if they are among the ``keep`` best so far.

    Ties go to the later step. Snapshots that fall out of the best ``keep`` are deleted, so the disk holds
    at most ``keep`` of them (one model's weights each).
    """
    import paddle

    if keep < 2:
        return
    step = state.global_step
    ranked = sorted([*state.snapshots, [float(step), accuracy]], key=lambda s: (-s[1], -s[0]))
    kept, dropped = ranked[:keep], ranked[keep:]
    if any(int(s[0]) == step for s in kept):
        ckpt.mkdir(parents=True, exist_ok=True)
        paddle.save(weights, str(snapshot_path(ckpt, step)))
    for old_step, _ in dropped:
        snapshot_path(ckpt, int(old_step)).unlink(missing_ok=True)
    state.snapshots = sorted(kept)


def average_weights(state_dicts: list[dict[str, Any]]) -> dict[str, Any]:
    """The element-wise mean of floating-point tensors; other tensors (ids, counters) come from the first."""
    import paddle

    first = state_dicts[0]
    out: dict[str, Any] = {}
    for name, value in first.items():
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        if np.issubdtype(array.dtype, np.floating):
            stacked = np.stack([np.asarray(sd[name].numpy(), dtype=np.float64) for sd in state_dicts])
            out[name] = paddle.to_tensor(stacked.mean(axis=0).astype(array.dtype))
        else:
            out[name] = value
    return out


def average_best_snapshots(
    ckpt: Path,
    state: LoopState,
    net: Any,
    dev_accuracy_of: Callable[[Any], float],
    say: Callable[[str], None],
) -> list[int]:
    """Average the kept snapshots into ``best.pdparams`` when that is not worse on dev; the steps used.

    ``dev_accuracy_of(net)`` evaluates the network as it stands. Returns [] (best single model kept) when
    fewer than two snapshots exist or the average loses on dev.
    """
    import paddle

    snaps = [s for s in state.snapshots if snapshot_path(ckpt, int(s[0])).is_file()]
    if len(snaps) < 2:
        return []
    steps = [int(s[0]) for s in snaps]
    averaged = average_weights([paddle.load(str(snapshot_path(ckpt, step))) for step in steps])
    net.set_state_dict(averaged)
    accuracy = dev_accuracy_of(net)
    listed = ", ".join(f"{step} ({acc:.4f})" for step, acc in ((int(s[0]), s[1]) for s in snaps))
    if accuracy >= state.best_dev:
        say(
            f"average of the {len(steps)} best dev evaluations (steps {listed}): dev accuracy {accuracy:.4f} "
            f">= best single {state.best_dev:.4f}: the average is the model"
        )
        paddle.save(averaged, str(ckpt / "best.pdparams"))
        state.best_dev = accuracy
        return steps
    say(
        f"average of the {len(steps)} best dev evaluations (steps {listed}): dev accuracy {accuracy:.4f} "
        f"< best single {state.best_dev:.4f}: the best single model is kept"
    )
    return []
