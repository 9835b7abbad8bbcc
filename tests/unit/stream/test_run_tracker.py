"""The run summary's rate counts labelling time only (first message consumed to last output acknowledged)."""

from __future__ import annotations

from worker.stream.run_tracker import RunSummary


def test_rate_is_over_labelling_time_not_the_whole_run() -> None:
    summary = RunSummary(consumed=100, results=98, dead_letters=2, seconds=30.0)
    assert summary.labelling_seconds == 0.0 and summary.messages_per_second == 0.0
    summary.first_consumed_at, summary.last_acknowledged_at = 112.0, 117.0
    assert summary.labelling_seconds == 5.0
    assert summary.messages_per_second == 20.0  # not 100 / 30 (model load, idle wait)
