"""kill -9 of a worker in the middle of a stream, then a restart.

At-least-once: every id comes out, and duplicates only come from the uncommitted tail: outputs that were
published after the last offset commit, at most `crash_duplicate_bound(settings, rate)` (the README's
bound, worker/kafka/offsets.py): the windows in the pipeline, `(max_queued_windows + 1) x
max_window_messages`, plus what was acknowledged in the last two commit intervals. The feed is paced at
`FEED_PER_S` so the rate is known.

Exactly-once (`SENTIMENT_DELIVERY=exactly_once`): results, dead letters and offsets commit in one
transaction per window, so a read_committed reader sees every id exactly once.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.faults.harness import (
    Collector,
    FaultScene,
    Feeder,
    Figures,
    collecting,
    duplicated_keys,
    review,
    running,
    stop_when_settled,
    tally_outputs,
    wait_for_log,
    worker_env,
)
from tests.integration.kafka_io import committed_offsets
from worker.config import WorkerSettings
from worker.kafka.offsets import crash_duplicate_bound

pytestmark = pytest.mark.integration

INPUTS = 1000
PARTITIONS = 3
WINDOW = 32  # SENTIMENT_MAX_WINDOW_MESSAGES
QUEUED_WINDOWS = 2  # SENTIMENT_MAX_QUEUED_WINDOWS
COMMIT_INTERVAL_MS = 100
CHUNK, PAUSE_S = 50, 0.1  # the feed: 50 messages every 0.1 s (plus produce time) = at most 500 msg/s
FEED_PER_S = CHUNK / PAUSE_S
SETTINGS = WorkerSettings(
    max_window_messages=WINDOW, max_queued_windows=QUEUED_WINDOWS, commit_interval_ms=COMMIT_INTERVAL_MS
)
DUPLICATE_BOUND = crash_duplicate_bound(
    SETTINGS.sections.batching, SETTINGS.sections.delivery, FEED_PER_S
)  # 3 x 32 + 2 x 50 = 196
KILL_AFTER_OUTPUTS = 300


def _kill9_then_restart(
    scene: FaultScene, names: dict[str, str], **env_extra: str
) -> tuple[Figures, Collector, dict[int, int]]:
    """Runs the scenario; returns the figures, the closed collector and the offsets committed at the kill."""
    bootstrap, log_dir = scene.bootstrap, scene.log_dir
    records = [review(i, "k9") for i in range(INPUTS)]
    env = worker_env(
        bootstrap,
        names,
        scene.model_dir,
        SENTIMENT_MAX_WINDOW_MESSAGES=str(WINDOW),
        SENTIMENT_MAX_QUEUED_WINDOWS=str(QUEUED_WINDOWS),
        SENTIMENT_COMMIT_INTERVAL_MS=str(COMMIT_INTERVAL_MS),
        # session.timeout.ms follows it (10 s): the killed member's partitions are reassigned sooner.
        SENTIMENT_MAX_POLL_INTERVAL_MS="10000",
        # The restart is the same replica: same worker id, so exactly-once's transactional id fences the
        # killed producer at once instead of leaving its transaction open for transaction_timeout_ms.
        SENTIMENT_WORKER_ID="k9-replica",
        **env_extra,
    )
    with collecting(bootstrap, names) as collector, running(env, log_dir, "first") as first:
        wait_for_log(first, "assigned")
        feeder = Feeder(bootstrap, names["reviews"], records, chunk=CHUNK, pause_s=PAUSE_S)
        feeder.start()
        collector.wait_until(
            lambda: collector.count() >= KILL_AFTER_OUTPUTS or not first.alive(),
            180,
            "outputs before the kill",
        )
        assert first.alive(), f"worker died before the kill:\n{first.stderr_tail()}"
        first.kill9()
        killed_at = collector.count()
        committed = committed_offsets(bootstrap, names["group"], names["reviews"], PARTITIONS)
        feeder.finish()
        assert killed_at < INPUTS, "the kill should land mid-stream"
        # No --idle-exit-s: the group holds the dead member's partitions until its session times out.
        with running(env, log_dir, "second") as second:
            collector.wait_until(
                lambda: len(collector.distinct_keys()) >= INPUTS or not second.alive(), 180, "every id"
            )
            stop_when_settled(collector, second)
    fig = tally_outputs(
        "kill9-" + env_extra.get("SENTIMENT_DELIVERY", "at_least_once"), records, collector, names
    )
    fig.notes.update({"outputs_at_kill": killed_at, "duplicate_bound": DUPLICATE_BOUND, "window": WINDOW})
    return fig, collector, committed


def test_kill_9_mid_stream_then_restart_loses_nothing_and_duplicates_stay_in_the_uncommitted_tail(
    scene: FaultScene,
) -> None:
    names = scene.topics(PARTITIONS, PARTITIONS)
    fig, collector, committed = _kill9_then_restart(scene, names)
    scene.record(fig)
    assert fig.lost == 0
    assert fig.results == INPUTS and fig.dead_letters == 0
    results = collector.records(names["results"])
    # Every duplicate comes from the tail past the offsets committed when the worker died.
    for record in results:
        if record.key in duplicated_keys(results):
            src: dict[str, Any] = record.json()["source"]
            assert src["offset"] >= committed[src["partition"]], (record.key, src, committed)
    assert fig.duplicates <= DUPLICATE_BOUND


def test_exactly_once_kill_9_mid_stream_then_restart_yields_every_id_exactly_once(
    scene: FaultScene,
) -> None:
    assert "delivery" in WorkerSettings.model_fields  # else SENTIMENT_DELIVERY would be silently ignored
    names = scene.topics(PARTITIONS, PARTITIONS)
    fig, _collector, _committed = _kill9_then_restart(scene, names, SENTIMENT_DELIVERY="exactly_once")
    scene.record(fig)
    # The collector reads with isolation.level=read_committed: aborted transactions are invisible.
    assert fig.lost == 0 and fig.duplicates == 0
    assert fig.results == INPUTS
