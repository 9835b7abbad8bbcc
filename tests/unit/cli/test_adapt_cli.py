"""`sentiment-worker adapt` as a user runs it: Ctrl-C checkpoints, exits 130 and prints the command that
continues; that command finishes the run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

from tests.unit.training.test_adapt import _rated_csv, hotel_reviews
from tests.worker_commands import start_command
from worker.cli.main import main
from worker.model.manifest import verify_model_dir


def _adapt_argv(tmp_path: Path, base: Path, out_name: str) -> tuple[Path, Path, list[str]]:
    """(the rated CSV of 400 hotel reviews, the output directory, `adapt`'s argv: 3 epochs on the CPU)."""
    data = _rated_csv(tmp_path / "rated.csv", hotel_reviews(400))
    out = tmp_path / out_name
    argv = [
        "adapt", str(data), "--output-dir", str(out), "--base", str(base), "--text-field", "评论",
        "--rating-field", "评分", "--learning-rate", "1e-3", "--device", "cpu", "--no-int8", "--epochs", "3",
    ]  # fmt: skip
    return data, out, argv


def _spawn(argv: list[str], stdout: int) -> subprocess.Popen[str]:
    """`python -m worker *argv` from this checkout, stderr dropped."""
    return start_command(dict(os.environ), *argv, stdout=stdout, stderr=subprocess.DEVNULL)


def test_sigint_checkpoints_exits_130_and_the_printed_command_resumes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    data, out, argv = _adapt_argv(tmp_path, tiny_model_dir, "ours")
    proc = _spawn(argv, subprocess.PIPE)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("step 1/"):  # the first training step is done: interrupt the run
            proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=600)
    printed = "\n".join(lines)
    assert code == 130, printed
    assert any(line.startswith("estimate: ") for line in lines)
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["global_step"] >= 1
    resume = lines[-1].strip()
    assert resume.startswith("sentiment-worker adapt ") and resume.endswith(" --resume"), printed
    assert main(shlex.split(resume)[1:]) in (0, 1)  # 1: the gate's verdict on a tiny model, not a failure
    verify_model_dir(out)
    assert not (out / "checkpoint").exists()


def test_after_kill_9_resume_ends_with_the_weights_of_an_uninterrupted_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import time

    import numpy as np

    from worker.files.review_files import ReviewFile
    from worker.model.weights import read_weights
    from worker.tools.adapt_rows import read_labelled
    from worker.training.adapt import adapt
    from worker.training.adapt_labels import LabelRule
    from worker.training.adapt_options import AdaptOptions

    data, out, argv = _adapt_argv(tmp_path, tiny_model_dir, "killed")
    proc = _spawn(argv, subprocess.DEVNULL)
    state = out / "checkpoint" / "state.json"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if (
                json.loads(state.read_text())["global_step"] >= 4
            ):  # a checkpoint at an evaluation (every 4 steps)
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    proc.kill()  # SIGKILL: no handler runs, whatever was being written stays half-written
    proc.wait(timeout=60)
    assert main([*argv, "--resume"]) in (0, 1)
    rows = read_labelled(ReviewFile(data, text_field="评论"), LabelRule("评分", rating=True))
    whole = tmp_path / "whole"
    options = AdaptOptions(
        output_dir=whole, base=tiny_model_dir, learning_rate=1e-3, device="cpu", int8=False, epochs=3
    )
    adapt(options, rows.examples, progress=lambda _line: None)
    first, second = read_weights(whole / "model.safetensors"), read_weights(out / "model.safetensors")
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
