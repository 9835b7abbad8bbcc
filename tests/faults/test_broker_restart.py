"""The broker stopped and restarted while the worker runs.

Uses a private broker started by the launcher (own ports and data dir), never the session's shared one.
The worker rides the outage out: it reports the broker unreachable (/readyz), librdkafka reconnects, the
idempotent producer retries within message.timeout.ms, it becomes ready again and labels everything, the
same process from start to end. A worker that dies during the outage fails the test. Nothing may be lost.
"""

from __future__ import annotations

import pytest

from tests.faults.harness import (
    FaultScene,
    PrivateBroker,
    collecting,
    outage_mid_stream,
    private_topics,
    readyz,
    review,
    running,
    tally_outputs,
    worker_env,
)
from worker.bench.worker_process import free_port

pytestmark = pytest.mark.integration

FIRST, SECOND = 600, 400


def test_broker_stop_and_restart_mid_stream_loses_nothing(
    scene: FaultScene, private_broker: PrivateBroker
) -> None:
    bootstrap = private_broker.bootstrap
    names = private_topics(bootstrap, "restart")
    records = [review(i, "br") for i in range(FIRST + SECOND)]
    # A coordinator waits for a member it still lists at most the rebalance timeout (max.poll.interval.ms,
    # 300 s by default) before it gives up on it; 60 s here keeps even that path inside the deadline.
    env = worker_env(bootstrap, names, scene.model_dir, SENTIMENT_MAX_POLL_INTERVAL_MS="60000")
    with (
        collecting(bootstrap, names) as collector,
        running(env, scene.log_dir / "logs", "worker-1", http_port=free_port()) as worker,
    ):

        def outage_seen() -> bool:
            return readyz(worker)[1].get("broker_reachable") is False

        args = (private_broker, worker, collector, names, records)
        outputs_before, recovery_s = outage_mid_stream(*args, FIRST, outage_seen, every_id_s=180)
    fig = tally_outputs("broker-restart", records, collector, names)
    fig.notes.update(
        {
            "outputs_before_outage": outputs_before,
            "ready_again_after_s": round(recovery_s, 1),
            "same_worker_throughout": True,
        }
    )
    scene.record(fig)
    assert fig.lost == 0 and fig.results == len(records)
