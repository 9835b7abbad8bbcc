from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from worker.cli import main
from worker.training.evaluate import (
    HELDOUT_FILE,
    classification_metrics,
    expected_calibration_error,
    format_comparison,
    format_report,
    static_speed_probe,
)
from worker.training.options import METRICS_FILE, TrainReport

NAMES = ["negative", "positive"]


def test_metrics_by_hand() -> None:
    labels = np.array([0, 0, 0, 1, 1])
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6], [0.45, 0.55]])
    m = classification_metrics(labels, probs, NAMES)
    assert m.confusion == [[2, 1], [0, 2]]
    assert m.accuracy == pytest.approx(0.8)
    assert (m.per_class["negative"].precision, m.per_class["negative"].recall) == (1.0, pytest.approx(2 / 3))
    assert (m.per_class["positive"].precision, m.per_class["positive"].recall) == (pytest.approx(2 / 3), 1.0)
    assert m.per_class["negative"].support == 3 and m.per_class["positive"].support == 2
    assert m.macro_f1 == pytest.approx(0.8)  # both F1s are 0.8
    # bins: 0.9 -> (0.8,0.9] correct; 0.8 -> (0.7,0.8] correct; 0.7 -> (0.6,0.7] wrong;
    # 0.6 and 0.55 -> (0.5,0.6] both correct, mean confidence 0.575
    expected = (abs(1 - 0.9) + abs(1 - 0.8) + abs(0 - 0.7) + 2 * abs(1 - 0.575)) / 5
    assert m.ece == pytest.approx(expected)


def test_ece_extremes() -> None:
    labels = np.array([0, 1, 0, 1])
    assert expected_calibration_error(labels, np.eye(2)[labels]) == 0.0
    assert expected_calibration_error(labels, np.eye(2)[1 - labels]) == 1.0
    assert expected_calibration_error(np.zeros(0, dtype=np.int64), np.zeros((0, 2))) == 0.0


def test_metrics_reject_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="does not match"):
        classification_metrics(np.array([0, 1]), np.ones((3, 2)) / 2, NAMES)


def test_static_probe_reports_the_measurement_and_survives_a_failing_one() -> None:
    calls: list[str] = []

    def measure(model: str) -> dict[str, float]:
        calls.append(model)
        return {"static_over_dynamic": 5.2, "efficiency": 0.7}

    static, note = static_speed_probe("/models/x", measure)
    assert static == {"static_over_dynamic": 5.2, "efficiency": 0.7} and note == "" and calls == ["/models/x"]

    def broken(model: str) -> dict[str, float]:
        raise FileNotFoundError(f"no config.json in {model}")

    static, note = static_speed_probe("/models/x", broken)
    assert static is None and "FileNotFoundError: no config.json in /models/x" in note
    assert "dynamic throughput only" in note


def test_evaluate_heldout_json_matches_training_metrics(
    tiny_model_dir: Path, tiny_model_report: TrainReport, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["evaluate", "--model", str(tiny_model_dir), "--heldout", "--json", "--no-static"]) == 0
    out = json.loads(capsys.readouterr().out)
    metrics = out["metrics"]
    assert metrics["n"] == tiny_model_report.test_size
    assert sum(map(sum, metrics["confusion"])) == metrics["n"]
    trained = json.loads((tiny_model_dir / METRICS_FILE).read_text(encoding="utf-8"))
    # same split; the serving classifier may cut the few over-long reviews differently than training did
    assert metrics["accuracy"] == pytest.approx(trained["test_accuracy"], abs=0.015)
    assert 0.0 <= metrics["ece"] <= 1.0 and set(metrics["per_class"]) == set(NAMES)
    assert out["throughput"]["sequences"] == metrics["n"] and out["throughput"]["sequences_per_second"] > 0
    assert out["throughput"]["static"] is None and "not requested" in out["throughput"]["note"]


def test_evaluate_table_on_a_csv(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [json.loads(line) for line in (tiny_model_dir / HELDOUT_FILE).read_text("utf-8").splitlines()[:40]]
    data = tmp_path / "labelled.csv"
    with data.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows((r["text"], r["label"]) for r in rows)
    assert main(["evaluate", "--model", str(tiny_model_dir), "--data", str(data), "--limit", "30"]) == 0
    out = capsys.readouterr().out
    assert "30 reviews" in out
    for heading in ("accuracy", "macro-F1", "ECE (10 bins)", "precision", "confusion (rows: true", "seq/s"):
        assert heading in out, heading
    # with the probe on, the report carries the static backend's numbers or says why it has none
    assert "static backend probe:" in out or "dynamic throughput only" in out


def test_evaluate_errors(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "好", "label": "great"}\n', encoding="utf-8")
    assert main(["evaluate", "--model", str(tiny_model_dir), "--data", str(bad)]) == 2
    assert (
        "bad.jsonl: no labelled reviews (1 rows read, 0 reviews kept; dropped 1: 1 bad labels (lines 1))"
        in (capsys.readouterr().err)
    )
    assert main(["evaluate", "--model", str(tmp_path), "--heldout"]) == 2
    assert "heldout.jsonl not found" in capsys.readouterr().err


def test_evaluate_says_how_many_rows_it_dropped_and_why(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [("好吃", "1"), ("难吃", "0"), ("好吃", "1"), ("好吃", "positive"), ("一般", "1"), ("一般", "0")]
    rows += [("  ", "1"), ("还行", "great"), ("太贵", "0")]
    data = tmp_path / "labelled.csv"
    with data.open("w", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerows([("text", "label"), *rows])
    assert main(["evaluate", "--model", str(tiny_model_dir), "--data", str(data), "--no-static"]) == 0
    out = capsys.readouterr().out
    assert (
        f"{data}: 9 rows read, 3 reviews kept; dropped 6: 2 repeated texts, 2 rows of texts with both "
        "labels, 1 empty texts, 1 bad labels (lines 9)"
    ) in out
    assert "3 reviews" in out


def test_compared_models_are_named_whole_with_version_and_directory() -> None:
    from worker.training.evaluate import Comparison, EvaluationReport, Throughput

    m = classification_metrics(np.array([0, 1]), np.array([[0.8, 0.2], [0.3, 0.7]]), NAMES)
    speed = Throughput(2, 0.5, 4.0, 32, None, "")
    new = EvaluationReport(
        "sentiment-bge-small-zh", "2026.2", "d.csv", m, speed, model_ref="models/default-int8"
    )
    old = EvaluationReport("sentiment-bge-small-zh", "2026.1", "d.csv", m, speed, model_ref="models/default")
    text = format_comparison(Comparison(new, old, margin=0.005))
    assert "candidate: sentiment-bge-small-zh 2026.2 (models/default-int8)" in text
    assert "incumbent: sentiment-bge-small-zh 2026.1 (models/default)" in text


def test_format_report_is_a_table() -> None:
    from worker.training.evaluate import EvaluationReport, Throughput

    m = classification_metrics(np.array([0, 1]), np.array([[0.8, 0.2], [0.3, 0.7]]), NAMES)
    text = format_report(
        EvaluationReport("m", "v1", "d.csv", m, Throughput(2, 0.5, 4.0, 32, None, "dynamic throughput only"))
    )
    assert "accuracy                    1.0000" in text
    assert "negative" in text and "4.0 seq/s" in text and "dynamic throughput only" in text


def _flipped_copy(model_dir: Path, out: Path) -> Path:
    """The same model with its classifier head negated: every prediction flips (a clearly worse model)."""
    import shutil

    from worker.model.manifest import write_manifest
    from worker.model.metadata import WEIGHTS_FILE
    from worker.model.weights import read_weights, save_weights

    shutil.copytree(model_dir, out)
    state = read_weights(out / WEIGHTS_FILE)
    for name in ("classifier.weight", "classifier.bias"):
        state[name] = -state[name]
    save_weights(state, out)
    write_manifest(out)
    return out


def test_promotion_gate_refuses_a_worse_candidate_and_passes_an_equal_one(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worse = _flipped_copy(tiny_model_dir, tmp_path / "flipped")
    args = ["evaluate", "--heldout", "--limit", "200", "--json"]
    assert main([*args, "--model", str(tiny_model_dir), "--compare", str(tiny_model_dir)]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["promote"] is True and same["regressions"] == []
    assert same["candidate"]["metrics"]["accuracy"] == same["incumbent"]["metrics"]["accuracy"]

    # the heldout set is the candidate's; a flipped head loses accuracy and macro-F1 on it
    assert main([*args, "--model", str(worse), "--compare", str(tiny_model_dir)]) == 1
    refused = json.loads(capsys.readouterr().out)
    assert refused["promote"] is False
    assert [r.split()[0] for r in refused["regressions"]] == [
        "accuracy",
        "macro_f1",
        "ECE",
    ]  # a flipped head is also confidently wrong
    assert refused["candidate"]["metrics"]["n"] == refused["incumbent"]["metrics"]["n"] == 200
    assert refused["candidate"]["metrics"]["accuracy"] < refused["incumbent"]["metrics"]["accuracy"] - 0.2

    assert main([*args[:-1], "--model", str(tiny_model_dir), "--compare", str(worse)]) == 0
    table = capsys.readouterr().out
    assert "candidate" in table and "incumbent" in table and "PROMOTE" in table


def test_promote_ships_a_better_candidate_in_float16_and_refuses_a_worse_one(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from worker.model.manifest import model_content_hash
    from worker.model.metadata import METADATA_FILE, WEIGHTS_FILE, weights_version

    default = _flipped_copy(tiny_model_dir, tmp_path / "default")  # a bad incumbent
    assert main(["promote", "--candidate", str(tiny_model_dir), "--default", str(default)]) == 0
    out = capsys.readouterr().out
    assert "PROMOTE" in out and f"promoted {tiny_model_dir} → {default}" in out
    meta = json.loads((default / METADATA_FILE).read_text("utf-8"))
    assert meta["training"]["weights_dtype"] == "float16" and meta["version"] == weights_version(default)
    size = (default / WEIGHTS_FILE).stat().st_size
    assert size < 0.6 * (tiny_model_dir / WEIGHTS_FILE).stat().st_size
    shipped = model_content_hash(default)  # promote wrote its manifest
    assert not (default / "checkpoint").exists()
    tokenizer_config = json.loads((default / "tokenizer_config.json").read_text("utf-8"))
    assert "name_or_path" not in tokenizer_config and "special_tokens_map_file" not in tokenizer_config

    worse = _flipped_copy(tiny_model_dir, tmp_path / "worse")
    assert main(["promote", "--candidate", str(worse), "--default", str(default)]) == 1
    assert f"kept {default}" in capsys.readouterr().out
    assert (default / WEIGHTS_FILE).stat().st_size == size  # untouched
    assert model_content_hash(default) == shipped


def test_the_gate_refuses_a_candidate_less_calibrated_by_more_than_the_ece_margin() -> None:
    from worker.training.evaluate import ECE_MARGIN, Comparison, EvaluationReport, Throughput

    labels = np.array([0, 1, 0, 1])
    speed = Throughput(4, 1.0, 4.0, 32, None, "dynamic throughput only")

    def report(confidence: float) -> EvaluationReport:  # every review right, at this confidence
        probs = np.array(
            [[confidence, 1 - confidence] if y == 0 else [1 - confidence, confidence] for y in labels]
        )
        return EvaluationReport("m", "v", "d.jsonl", classification_metrics(labels, probs, NAMES), speed)

    sure, unsure = report(0.99), report(0.9)  # ECE 0.01 and 0.10, the same accuracy and macro-F1
    refused = Comparison(unsure, sure, margin=0.005)
    assert refused.ece_margin == ECE_MARGIN
    assert [r.split()[0] for r in refused.regressions] == ["ECE"]
    assert "calibrate" in refused.regressions[0] and "KEEP THE INCUMBENT: ECE 0.1000" in format_comparison(
        refused
    )
    assert Comparison(unsure, sure, margin=0.005, ece_margin=0.1).regressions == []
    assert Comparison(sure, unsure, margin=0.005).regressions == []  # better calibrated: never a regression
    assert Comparison(sure, unsure, margin=0.005).to_json()["ece_margin"] == ECE_MARGIN
