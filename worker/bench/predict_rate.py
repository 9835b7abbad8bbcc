"""The `predict` command's marginal rate, the bar the worker's backlog drain is held to.

`sentiment-worker predict` labels a file with the engine's best settings (decoding on one thread, the
next chunk submitted while the engine labels this one). Its marginal rate is N / (t(2N) − t(N)), where t(k)
is the wall time of a `predict` subprocess on a k-line file: start-up and model load are in both and cancel.
With R pairs (`PredictPairs.run_pair`), the N and 2N runs alternate and t(k) is the median of its R runs: on a
shared machine a single pair's rate swung from 660 to 4,100 lines/s (the fast model, one session), because
the difference of two wall times carries the noise of both. Each run's output is checked to hold one row
per input line, numbered 1..k in order (conservation).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from worker.errors import OperationError

__all__ = [
    "PredictPairs",
    "PredictRun",
    "PredictRunError",
    "marginal_rate",
    "one_line",
    "run_predict",
]

TIMED_AS = (
    "N / (t(2N) − t(N)), t(k) = the median wall time of the `predict` subprocesses on a k-line file "
    "(N and 2N runs alternated)"
)


class PredictRunError(OperationError):
    """The `predict` subprocess failed or ran too long; the message carries its stderr tail."""


@dataclass(frozen=True)
class PredictRun:
    """One `predict` run: lines in and out, rows that are errors, wall seconds (start-up included)."""

    lines_in: int
    lines_out: int
    errors: int
    numbered_in_order: bool
    seconds: float

    @property
    def conserved(self) -> bool:
        """One output row per input line, numbered 1..lines_in in order."""
        return self.lines_out == self.lines_in and self.numbered_in_order


def marginal_rate(n: int, seconds_n: float, seconds_2n: float) -> float | None:
    """N / (t(2N) − t(N)) in lines/s; None when N < 1 or t(2N) <= t(N) (the timing noise exceeds the work
    of N lines: no rate, rather than a negative or infinite one)."""
    extra = seconds_2n - seconds_n
    if n < 1 or not extra > 0:
        return None
    return n / extra


def one_line(text: str) -> str:
    """`text` as one line of a `predict` input file: its line breaks become spaces."""
    return text.replace("\r", " ").replace("\n", " ")


def run_predict(
    program: Sequence[str],
    input_path: Path,
    output_path: Path,
    env: Mapping[str, str],
    timeout_s: float,
) -> PredictRun:
    """`program` (the predict command line, input file last) with stdout to `output_path`, timed."""
    lines_in = _count_lines(input_path)
    err_path = output_path.with_suffix(".err")
    with output_path.open("wb") as out, err_path.open("wb") as err:
        started = time.perf_counter()
        try:
            code = subprocess.run(
                [*program, str(input_path)],
                env=dict(env),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                timeout=timeout_s,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            raise PredictRunError(
                f"predict on {lines_in} lines ran past {timeout_s:.0f} s:\n{_tail(err_path)}"
            ) from None
        seconds = time.perf_counter() - started
    if code != 0:
        raise PredictRunError(f"predict on {lines_in} lines exited with {code}:\n{_tail(err_path)}")
    numbers, errors = _rows(output_path)
    return PredictRun(
        lines_in=lines_in,
        lines_out=len(numbers),
        errors=errors,
        numbered_in_order=numbers == list(range(1, lines_in + 1)),
        seconds=seconds,
    )


class PredictPairs:
    """`predict` on the first `n` and the first 2`n` of `texts` (one per line), run a pair at a time.

    The input files and the `--config` file (`config`: the served inference settings) are written once;
    each `run_pair` runs N then 2N, so that a caller can interleave pairs with other measurements (`bench`
    puts one after each drain). The batch size and the token budget are flags, because `predict` takes them
    as flags. `program` replaces `python -m worker` (tests).
    """

    def __init__(
        self,
        texts: Sequence[str],
        n: int,
        *,
        model: str,
        device: str,
        max_batch_size: int | None,
        max_batch_tokens: int,
        config: Mapping[str, Any],
        env: Mapping[str, str],
        workdir: Path,
        timeout_s: float,
        program: Sequence[str] = (sys.executable, "-m", "worker"),
    ) -> None:
        if len(texts) < 2 * n:
            raise ValueError(f"{2 * n} texts needed, {len(texts)} given")
        config_path = workdir / "predict-config.json"
        config_path.write_text(json.dumps(dict(config)), encoding="utf-8")
        self.command = [
            *program, "predict", "--config", str(config_path), "--model", model, "--device", device,
            "--max-batch-tokens", str(max_batch_tokens), "--no-progress",
            *(["--batch-size", str(max_batch_size)] if max_batch_size is not None else []),
        ]  # fmt: skip
        self.n, self.env, self.workdir, self.timeout_s = n, env, workdir, timeout_s
        self.sources = {}
        for k in (n, 2 * n):
            self.sources[k] = workdir / f"predict-{k}.txt"
            self.sources[k].write_text("".join(one_line(t) + "\n" for t in texts[:k]), encoding="utf-8")
        self.runs: list[PredictRun] = []

    def run_pair(self) -> float | None:
        """`predict` on N lines, then on 2N; this pair's marginal rate (None: no extra time for 2N)."""
        short, long = (
            run_predict(self.command, self.sources[k], self.workdir / f"predict-{k}.jsonl", self.env,
                        self.timeout_s)
            for k in (self.n, 2 * self.n)
        )  # fmt: skip
        self.runs += [short, long]
        return marginal_rate(self.n, short.seconds, long.seconds)

    def report(self) -> dict[str, Any]:
        """Every run, each pair's rate, and the marginal rate from the median times (at least one pair)."""
        if not self.runs:
            raise ValueError("no predict pair has run")
        short = [run.seconds for run in self.runs[0::2]]
        long = [run.seconds for run in self.runs[1::2]]
        rate = marginal_rate(self.n, statistics.median(short), statistics.median(long))
        return {
            "messages": self.n,
            "messages_per_second": rate,
            "repeats": len(short),
            "median_seconds": [round(statistics.median(short), 3), round(statistics.median(long), 3)],
            "pair_rates": [_rounded(marginal_rate(self.n, a, b)) for a, b in zip(short, long, strict=True)],
            "runs": [{**asdict(run), "seconds": round(run.seconds, 3)} for run in self.runs],
            "conservation": {"ok": all(run.conserved for run in self.runs)},
            "timed_as": TIMED_AS,
            "command": " ".join([*self.command, "FILE"]),
        }


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 1)


def _count_lines(path: Path) -> int:
    with path.open("rb") as source:
        return sum(1 for _ in source)


def _rows(path: Path) -> tuple[list[int | None], int]:
    """The `line` number of each output row (None when a row is not a JSON object with one), and how many
    rows are errors."""
    numbers: list[int | None] = []
    errors = 0
    with path.open("rb") as rows:
        for raw in rows:
            try:
                row = json.loads(raw)
            except ValueError:
                numbers.append(None)
                continue
            if not isinstance(row, dict):
                numbers.append(None)
                continue
            numbers.append(row.get("line"))
            if "error" in row:
                errors += 1
    return numbers, errors


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:]
