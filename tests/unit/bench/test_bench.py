"""`bench`'s predict phase without a model or a broker: the marginal rate's arithmetic, the run's
conservation check, its flags and options, the e2e_vs_predict ratio and target, and the table's row."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from worker.bench.bench import (
    BenchOptions,
    Phase,
    drains_and_predict_pairs,
    median_drain,
    ratios_and_targets,
    steady_rate,
)
from worker.bench.bench_table import format_table
from worker.bench.predict_rate import (
    PredictPairs,
    PredictRunError,
    marginal_rate,
    one_line,
    run_predict,
)
from worker.cli.bench import bench_options
from worker.cli.main import build_parser
from worker.errors import ConfigurationError

# A stand-in for `python -m worker`: `predict ... FILE` writes one row per line of FILE (like `predict`), and
# records its arguments and config next to it. FAKE_DROP in the config drops the last row.
FAKE_WORKER = """
import json, sys, time
from pathlib import Path
args = sys.argv[1:]
source = Path(args[-1])
config = json.loads(Path(args[args.index("--config") + 1]).read_text())
Path(str(source) + ".args").write_text(json.dumps({"args": args, "config": config}))
lines = source.read_text(encoding="utf-8").splitlines()
if config.get("FAKE_EXIT"):
    print("model: no such model", file=sys.stderr)
    sys.exit(2)
time.sleep(0.002 * len(lines))
rows = [{"line": i, "label": "positive"} for i, _ in enumerate(lines, start=1)]
for row in rows[: len(rows) - 1] if config.get("FAKE_DROP") else rows:
    print(json.dumps(row))
"""


@pytest.fixture
def fake_worker(tmp_path: Path) -> list[str]:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER, encoding="utf-8")
    return [sys.executable, str(script)]


def measure_predict(texts: list[str], n: int, *, repeats: int = 1, **prepare: Any) -> dict[str, Any]:
    """`repeats` `predict` pairs back to back, and their report."""
    pairs = PredictPairs(texts, n, **prepare)
    for _ in range(repeats):
        pairs.run_pair()
    return pairs.report()


# ----- the marginal rate -----
def test_the_marginal_rate_is_n_over_the_extra_time_of_2n() -> None:
    assert marginal_rate(1000, 4.0, 6.0) == 500.0  # start-up (in both) cancels: 1000 lines in 2 s
    assert marginal_rate(10_000, 12.5, 112.5) == 100.0


@pytest.mark.parametrize(("seconds_n", "seconds_2n"), [(5.0, 5.0), (5.0, 4.9), (5.0, math.nan)])
def test_a_timing_without_extra_time_for_2n_gives_no_rate(seconds_n: float, seconds_2n: float) -> None:
    assert marginal_rate(1000, seconds_n, seconds_2n) is None  # not infinite, not negative


def test_no_lines_gives_no_rate() -> None:
    assert marginal_rate(0, 1.0, 2.0) is None


def test_a_review_becomes_exactly_one_line() -> None:
    assert one_line("好评\n物流快\r\n值得") == "好评 物流快  值得"
    assert "\n" not in one_line("\n\n") and "\r" not in one_line("a\rb")


# ----- running predict -----
def test_predict_runs_on_n_and_2n_lines_with_the_served_settings(
    fake_worker: list[str], tmp_path: Path
) -> None:
    texts = ["第一行\n还是第一行", "second", "third", "fourth", "fifth"]
    config = {"backend": "onnx", "tokenizer": "fast", "cpu_threads": 2, "log_level": "WARNING"}
    report = measure_predict(
        texts,
        2,
        model="models/x",
        device="cpu",
        max_batch_size=24,
        max_batch_tokens=2048,
        config=config,
        env={"PATH": "/usr/bin:/bin"},
        workdir=tmp_path,
        timeout_s=60,
        program=fake_worker,
    )
    assert [(run["lines_in"], run["lines_out"]) for run in report["runs"]] == [(2, 2), (4, 4)]
    assert report["conservation"] == {"ok": True}
    assert report["messages"] == 2 and all(run["seconds"] > 0 for run in report["runs"])
    first = (tmp_path / "predict-2.txt").read_text(encoding="utf-8")
    assert first == "第一行 还是第一行\nsecond\n"  # the review's line break does not split it
    seen = json.loads((tmp_path / "predict-2.txt.args").read_text())
    assert seen["config"] == config
    args = seen["args"]
    assert args[0] == "predict" and "--no-progress" in args
    flags = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert flags["--model"] == "models/x" and flags["--device"] == "cpu"
    assert (flags["--batch-size"], flags["--max-batch-tokens"]) == ("24", "2048")


def test_a_lost_output_row_breaks_conservation(fake_worker: list[str], tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("a\nb\nc\n", encoding="utf-8")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"FAKE_DROP": True}))
    run = run_predict(
        [*fake_worker, "predict", "--config", str(config)], source, tmp_path / "out.jsonl", {}, 60
    )
    assert (run.lines_in, run.lines_out) == (3, 2) and not run.conserved


def test_a_failed_predict_run_raises_with_its_stderr(fake_worker: list[str], tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("a\n", encoding="utf-8")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"FAKE_EXIT": True}))
    with pytest.raises(PredictRunError, match="exited with 2(.|\n)*no such model"):
        run_predict(
            [*fake_worker, "predict", "--config", str(config)], source, tmp_path / "out.jsonl", {}, 60
        )


def test_too_few_texts_for_2n_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="4 texts needed"):
        measure_predict(
            ["a", "b", "c"],
            2,
            model="m",
            device="cpu",
            max_batch_size=1,
            max_batch_tokens=1,
            config={},
            env={},
            workdir=tmp_path,
            timeout_s=1,
        )


# ----- the flags -----
def parse(*argv: str) -> Any:
    return build_parser().parse_args(["bench", "--model", "m", *argv])


def test_predict_messages_defaults_and_quick_size() -> None:
    assert bench_options(parse()).predict_messages == 10_000
    quick = bench_options(parse("--quick"))
    assert quick.predict_messages == 600 and quick.predict_messages <= quick.messages
    assert bench_options(parse("--quick", "--predict-messages", "50")).predict_messages == 50
    assert bench_options(parse("--predict-messages", "0")).predict_messages == 0  # 0 skips the phase


def test_a_negative_predict_messages_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="--predict-messages"):
        bench_options(parse("--predict-messages", "-1"))


# ----- the ratio, its target, the table -----
def phases(e2e_rate: float) -> tuple[Phase, Phase, Phase]:
    model_only = Phase(
        messages=1000,
        seconds=10.0,
        results=1000,
        extra={"padding_efficiency": 0.9, "tokenization_share": 0.1},
    )
    e2e = Phase(
        messages=1000,
        seconds=1000 / e2e_rate,
        results=1000,
        extra={"tokenization_share": 0.05, "rss": {"growth": 0.01}},
    )
    naive = Phase(messages=100, seconds=10.0, results=100)
    return model_only, e2e, naive


def predict_phase(rate: float | None, pair_rates: tuple[float | None, ...] | None = None) -> dict[str, Any]:
    pair_rates = (rate,) if pair_rates is None else pair_rates
    runs = [
        {"lines_in": n, "lines_out": n, "errors": 0, "numbered_in_order": True, "seconds": s}
        for _ in pair_rates
        for n, s in ((600, 5.0), (1200, 7.0))
    ]
    return {
        "messages": 600,
        "messages_per_second": rate,
        "runs": runs,
        "conservation": {"ok": True},
        "repeats": len(pair_rates),
        "median_seconds": [5.0, 7.0],
        "pair_rates": list(pair_rates),
    }


@pytest.mark.parametrize(("e2e_rate", "met"), [(95.0, True), (91.0, True), (89.0, False)])
def test_e2e_vs_predict_is_flagged_against_90_percent(e2e_rate: float, met: bool) -> None:
    ratios, targets = ratios_and_targets(*phases(e2e_rate), predict_phase(100.0))
    assert ratios["e2e_vs_predict"] == pytest.approx(e2e_rate / 100.0)
    assert targets["e2e_vs_predict"]["target"] == 0.90 and targets["e2e_vs_predict"]["met"] is met
    assert ratios["e2e_vs_model_only"] == pytest.approx(e2e_rate / 100.0)  # the model-only ratio stays


@pytest.mark.parametrize("predict", [None, predict_phase(None)], ids=["skipped", "no-rate"])
def test_without_a_predict_rate_the_ratio_is_none(predict: dict[str, Any] | None) -> None:
    ratios, targets = ratios_and_targets(*phases(95.0), predict)
    assert ratios["e2e_vs_predict"] is None and targets["e2e_vs_predict"]["met"] is None


def report_with(predict: dict[str, Any] | None) -> dict[str, Any]:
    model_only, e2e, naive = phases(95.0)
    ratios, targets = ratios_and_targets(model_only, e2e, naive, predict)
    rss = {"peak_bytes": 2**29, "draining_min_bytes": 2**28, "draining_max_bytes": 2**29, "samples": 3}
    latency = {"p50": 10.0, "p95": 20.0, "p99": 30.0}
    conserved = {"ok": True}
    return {
        "model": {"name": "tiny", "version": "1", "device": "cpu"},
        "max_batch_tokens": 2048,
        "max_batch_tokens_from": "test",
        "max_batch_size": 32,
        "max_window_messages": 512,
        "model_only": {"messages": 1000, "messages_per_second": 100.0, "real_tokens_per_second": 5000.0,
                       "padding_efficiency": 0.9, "tokenization_share": 0.1},
        "end_to_end": {"messages": 1000, "messages_per_second": 95.0, "conservation": conserved,
                       "tokenization_share": 0.05, "rss": rss, "rates_of_every_drain": [95.0]},
        "predict": predict,
        "naive": {"messages": 100, "messages_per_second": 10.0, "padded_to": 128},
        "latency": {"messages": 100, "latency_ms": latency, "offered_rate_per_s": 40.0,
                    "conservation": conserved},
        "ratios": ratios,
        "targets": targets,
    }  # fmt: skip


def test_the_table_shows_the_predict_row_and_its_target() -> None:
    table = format_table(report_with(predict_phase(300.0)))
    row = next(line for line in table.splitlines() if line.startswith("predict "))
    assert "300.0 msg/s marginal" in row and "600 and 1200 reviews, 5.0 s and 7.0 s;" in row
    assert "conservation ok" in row
    target = next(line for line in table.splitlines() if line.startswith("e2e_vs_predict"))
    assert "31.7%" in target and ">= 90.0%" in target and "MISSED" in target  # 95 / 300


def test_the_table_says_when_predict_was_skipped_or_gave_no_rate() -> None:
    skipped = format_table(report_with(None))
    assert "skipped (--predict-messages 0)" in skipped
    assert next(line for line in skipped.splitlines() if line.startswith("e2e_vs_predict")).endswith("n/a")
    no_rate = format_table(report_with(predict_phase(None)))
    assert "no marginal rate: t(1200) <= t(600)" in no_rate


def test_the_table_shows_repeated_predict_runs_by_their_medians_and_each_pair() -> None:
    table = format_table(report_with(predict_phase(300.0, (280.0, None, 310.0))))
    row = next(line for line in table.splitlines() if line.startswith("predict "))
    assert "600 and 1200 reviews, 3 runs each, median 5.0 s and 7.0 s; pairs 280.0, –, 310.0 msg/s" in row


# ----- repeated predict runs -----
def test_repeated_predict_runs_alternate_and_the_rate_comes_from_the_median_times(
    fake_worker: list[str], tmp_path: Path
) -> None:
    report = measure_predict(
        [f"review {i}" for i in range(80)],
        40,  # the fake sleeps 2 ms a line: 80 ms more for 2N, well above its start-up's jitter
        model="m",
        device="cpu",
        max_batch_size=1,
        max_batch_tokens=16,
        config={},
        env={"PATH": "/usr/bin:/bin"},
        workdir=tmp_path,
        timeout_s=60,
        repeats=3,
        program=fake_worker,
    )
    assert [run["lines_in"] for run in report["runs"]] == [40, 80, 40, 80, 40, 80]  # N, 2N alternated
    assert report["repeats"] == 3 and len(report["pair_rates"]) == 3
    short = sorted(run["seconds"] for run in report["runs"][0::2])[1]
    long = sorted(run["seconds"] for run in report["runs"][1::2])[1]
    assert report["median_seconds"] == [short, long]
    expected = marginal_rate(40, short, long)
    assert expected is not None and report["messages_per_second"] == pytest.approx(expected, rel=0.02)
    assert report["conservation"] == {"ok": True}


def test_the_naive_http_baseline_is_served_by_bench_not_by_serve() -> None:
    parser = build_parser()
    assert parser.parse_args(["bench", "--naive-server", "8123"]).naive_server == 8123
    assert parser.parse_args(["bench", "--http"]).naive_server is None
    with pytest.raises(SystemExit):  # the product's `serve` carries no benchmark baseline
        parser.parse_args(["serve", "--naive"])


def test_predict_repeats_defaults_flag_and_refusal(tmp_path: Path) -> None:
    assert bench_options(parse()).predict_repeats == 3
    assert bench_options(parse("--quick")).predict_repeats == 1
    assert bench_options(parse("--predict-repeats", "5")).predict_repeats == 5
    with pytest.raises(ConfigurationError, match="--predict-repeats"):
        bench_options(parse("--predict-repeats", "0"))
    unrun = PredictPairs(
        ["a", "b"], 1, model="m", device="cpu", max_batch_size=1, max_batch_tokens=1,
        config={}, env={}, workdir=tmp_path, timeout_s=1,
    )  # fmt: skip
    with pytest.raises(ValueError, match="no predict pair has run"):
        unrun.report()


# ----- repeated drains -----
def drain(seconds: float, ok: bool = True) -> Phase:
    return Phase(messages=1000, seconds=seconds, extra={"conservation": {"ok": ok, "inputs": 1000}})


def test_the_median_drain_is_kept_with_every_drains_rate() -> None:
    drains = [drain(2.0), drain(4.0), drain(1.0)]
    kept = median_drain(drains)
    assert kept.messages_per_second == 500.0  # 1000 in 2 s: the middle of 250, 500 and 1000 msg/s
    assert "rates_of_every_drain" not in drains[0].extra  # the drains measured are left as they were
    assert kept.extra["rates_of_every_drain"] == [500.0, 250.0, 1000.0]  # in the order they ran
    assert kept.extra["conservation"]["ok"] and kept.extra["conservation"]["inputs"] == 1000
    assert median_drain([drain(2.0), drain(1.0)]).messages_per_second == 500.0  # even count: the lower


def test_one_broken_drain_breaks_the_kept_drains_conservation() -> None:
    kept = median_drain([drain(2.0), drain(4.0, ok=False), drain(1.0)])
    assert kept.messages_per_second == 500.0 and kept.extra["conservation"]["ok"] is False
    assert [c["ok"] for c in kept.extra["conservation"]["every_drain"]] == [True, False, True]


def test_drains_defaults_flag_and_refusal() -> None:
    assert bench_options(parse()).drains == 3
    assert bench_options(parse("--quick")).drains == 1
    assert bench_options(parse("--drains", "5")).drains == 5
    with pytest.raises(ConfigurationError, match="--drains"):
        bench_options(parse("--drains", "0"))


def test_the_table_shows_every_drains_rate_when_there_were_several() -> None:
    report = report_with(predict_phase(300.0))
    report["end_to_end"]["rates_of_every_drain"] = [90.0, 95.0, 120.0]
    row = next(line for line in format_table(report).splitlines() if line.startswith("end-to-end"))
    assert "95.0 msg/s (1000 reviews through the broker, median of 3 drains: 90.0, 95.0, 120.0 msg/s;" in row
    report["end_to_end"]["steady_messages_per_second"] = 99.5
    row = next(line for line in format_table(report).splitlines() if line.startswith("end-to-end"))
    assert "120.0 msg/s; steady (the middle 80 % of results) 99.5 msg/s; conservation ok)" in row
    single = format_table(report_with(predict_phase(300.0)))
    assert "drains" not in next(line for line in single.splitlines() if line.startswith("end-to-end"))


# ----- drains and predict pairs interleaved -----
def test_drains_and_predict_pairs_alternate_round_by_round(fake_worker: list[str], tmp_path: Path) -> None:
    pairs = PredictPairs(
        [f"review {i}" for i in range(20)], 10, model="m", device="cpu", max_batch_size=1,
        max_batch_tokens=16, config={}, env={"PATH": "/usr/bin:/bin"}, workdir=tmp_path, timeout_s=60,
        program=fake_worker,
    )  # fmt: skip
    runs_before_drain: list[int] = []

    def one_drain(i: int) -> Phase:
        runs_before_drain.append(len(pairs.runs))
        return drain(1.0 + i)

    said: list[str] = []
    options = BenchOptions(drains=3, predict_repeats=2)
    drains, report = drains_and_predict_pairs(one_drain, pairs, options, said.append)
    assert runs_before_drain == [0, 2, 4]  # drain 0, pair 0, drain 1, pair 1, drain 2
    assert [d.seconds for d in drains] == [1.0, 2.0, 3.0]
    assert report is not None and [run["lines_in"] for run in report["runs"]] == [10, 20, 10, 20]
    assert report["repeats"] == 2 and said == ["predict: 10 and 20 reviews (pair 1 of 2)",
                                               "predict: 10 and 20 reviews (pair 2 of 2)"]  # fmt: skip
    drains, report = drains_and_predict_pairs(one_drain, None, options, said.append)
    assert len(drains) == 3 and report is None  # --predict-messages 0: drains only


def test_e2e_vs_predict_is_the_median_of_each_drain_over_its_neighbouring_pair() -> None:
    model_only, _, naive = phases(100.0)
    kept = drain(10.0)  # 100 msg/s, the median of the three drains
    extra = {"tokenization_share": 0.05, "rss": {"growth": 0.0}, "rates_of_every_drain": [90.0, 100.0, 120.0]}
    e2e = replace(kept, extra={**kept.extra, **extra})
    predict = predict_phase(150.0, (100.0, None, 100.0))  # pair 2 gave no rate: its round is left out
    ratios, targets = ratios_and_targets(model_only, e2e, naive, predict)
    assert ratios["e2e_vs_predict"] == pytest.approx((0.9 + 1.2) / 2)
    assert ratios["e2e_vs_predict_of_medians"] == pytest.approx(100.0 / 150.0)  # kept drain 100 msg/s
    assert targets["e2e_vs_predict"]["value"] == ratios["e2e_vs_predict"] and targets["e2e_vs_predict"]["met"]


def test_the_table_shows_each_rounds_drain_over_pair_ratio() -> None:
    report = report_with(predict_phase(300.0, (280.0, None, 310.0)))
    report["e2e_vs_predict_by_round"] = [0.925, None, 1.04]
    row = next(line for line in format_table(report).splitlines() if line.startswith("predict "))
    assert "; drain / pair by round 92.5%, –, 104.0%; conservation ok" in row


def test_the_steady_rate_leaves_out_the_first_and_last_tenth_of_a_drain() -> None:
    # 100 results: a slow start (10 results over 2 s), 80 results 10 ms apart, a slow end.
    start = [i * 200 for i in range(10)]
    middle = [2000 + i * 10 for i in range(80)]
    end = [2800 + i * 300 for i in range(10)]
    assert steady_rate(end + middle + start) == pytest.approx(79 / 0.79)  # results 10..89, in any order
    assert steady_rate(list(range(19))) is None  # too few results to trim
    assert steady_rate([5] * 40) is None  # no time between them
