"""The broker stopped and restarted while the worker runs.

Uses a private broker started by the launcher (own ports and data dir), never the session's shared one.
The worker either rides the outage out (librdkafka reconnects; the idempotent producer retries within
message.timeout.ms) or exits non-zero, in which case a restart must resume. Nothing may be lost.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.harness import (
    Collector,
    Figures,
    PrivateBroker,
    WorkerProcess,
    make_topics,
    produce_all,
    review,
    tally,
    wait_for_log,
    worker_env,
)

pytestmark = pytest.mark.integration

FIRST, SECOND = 600, 400
OUTAGE_S = 8.0


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[PrivateBroker]:
    broker = PrivateBroker(tmp_path / "broker")
    broker.up()
    try:
        yield broker
    finally:
        broker.down()


def test_broker_stop_and_restart_mid_stream_loses_nothing(
    private_broker: PrivateBroker,
    tiny_model_dir: Path,
    tmp_path: Path,
    record_figures: Callable[[Figures], None],
) -> None:
    bootstrap = private_broker.bootstrap
    suffix = uuid.uuid4().hex[:8]
    names = {k: f"restart-{k}-{suffix}" for k in ("reviews", "results", "dlq", "group")}
    make_topics(bootstrap, {names["reviews"]: 3, names["results"]: 3, names["dlq"]: 1})
    records = [review(i, "br") for i in range(FIRST + SECOND)]
    env = worker_env(bootstrap, names, tiny_model_dir)
    collector = Collector(bootstrap, [names["results"], names["dlq"]])
    collector.start()
    workers = [WorkerProcess(env, tmp_path / "logs", "worker-1")]
    restarted = False
    try:
        wait_for_log(workers[0], "assigned")
        # A backlog, so the broker goes away while the worker is busy with it.
        produce_all(bootstrap, names["reviews"], records[:FIRST])
        collector.wait_until(lambda: collector.count() >= 100, 120, "outputs before the outage")
        outputs_before = collector.count()
        private_broker.down()
        time.sleep(OUTAGE_S)
        private_broker.up()
        if not workers[0].alive():  # it gave up during the outage: it must have said so, non-zero
            assert workers[0].proc.returncode != 0
            restarted = True
            workers.append(WorkerProcess(env, tmp_path / "logs", "worker-2"))
        produce_all(bootstrap, names["reviews"], records[FIRST:])
        collector.wait_until(
            lambda: len(collector.distinct_keys()) >= len(records) or not workers[-1].alive(), 180, "every id"
        )
        collector.settle()
        workers[-1].terminate()
        assert workers[-1].wait(60) == 0, workers[-1].stderr_tail()
    finally:
        for worker in workers:
            worker.stop()
        collector.close()
    fig = tally(
        "broker-restart",
        [key for key, _ in records],
        collector.records(names["results"]),
        collector.records(names["dlq"]),
    )
    fig.notes.update(
        {"outage_s": OUTAGE_S, "outputs_before_outage": outputs_before, "worker_restarted": restarted}
    )
    record_figures(fig)
    assert fig.lost == 0 and fig.results == len(records)
