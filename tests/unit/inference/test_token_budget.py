"""The token budget is chosen in one place: a number as it is, `auto` calibrated (from the cache when it
matches), a failed calibration a StartupError."""

from __future__ import annotations

from typing import Any

import pytest

from worker.config import WorkerSettings
from worker.inference import token_budget
from worker.inference.token_budget import BudgetChoice, StartupError, choose_token_budget
from worker.inference.tuning import TuningError, TuningResult


class Calibration:
    """Stands in for `resolve_token_budget`: counts the calls, answers `result` or raises `error`."""

    def __init__(self, result: TuningResult | None = None, error: Exception | None = None) -> None:
        self.result, self.error, self.calls = result, error, 0

    def __call__(self, _batching: Any, _model: Any, _classifier: Any, **_kwargs: Any) -> TuningResult:
        self.calls += 1
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def choose(settings: WorkerSettings, classifier: Any, **kwargs: Any) -> BudgetChoice:
    """`choose_token_budget` on the sections the composition root passes it."""
    return choose_token_budget(settings.sections.batching, settings.sections.model, classifier, **kwargs)


def _tuned(tokens: int, mode: Any = "cpu-throughput", *, cached: bool = False) -> TuningResult:
    return TuningResult(mode=mode, max_batch_tokens=tokens, key={}, details={}, probes=[], from_cache=cached)


@pytest.fixture
def calibration(monkeypatch: pytest.MonkeyPatch) -> Calibration:
    fake = Calibration(_tuned(1536, cached=True))
    monkeypatch.setattr(token_budget, "resolve_token_budget", fake)
    return fake


def test_a_number_is_used_as_it_is_without_calibrating(calibration: Calibration) -> None:
    assert choose(WorkerSettings(max_batch_tokens=2048), object()) == BudgetChoice(2048, "max_batch_tokens")
    assert choose(WorkerSettings(), object(), requested=512).max_batch_tokens == 512
    assert calibration.calls == 0


def test_auto_in_the_settings_calibrates(calibration: Calibration) -> None:
    settings = WorkerSettings(max_batch_tokens="auto")  # type: ignore[arg-type]  # as SENTIMENT_MAX_BATCH_TOKENS
    assert settings.max_batch_tokens_auto
    assert choose(settings, object()) == BudgetChoice(1536, "tuned for CPU throughput, cached")
    assert calibration.calls == 1


def test_auto_requested_calibrates_whatever_the_settings_say(calibration: Calibration) -> None:
    calibration.result = _tuned(8192, "gpu-memory")
    choice = choose(WorkerSettings(max_batch_tokens=2048), object(), requested="auto")
    assert choice == BudgetChoice(8192, "tuned for VRAM")


def test_a_failed_calibration_is_a_startup_error(calibration: Calibration) -> None:
    calibration.error = TuningError("no probe fitted")
    with pytest.raises(StartupError, match="max_batch_tokens=auto: no probe fitted"):
        choose(WorkerSettings(max_batch_tokens_auto=True), object())
