"""The broker stopped and restarted while the worker runs.

Uses a private broker started by the launcher (own ports and data dir), never the session's shared one.
The worker rides the outage out: it reports the broker unreachable (/readyz), librdkafka reconnects, the
idempotent producer retries within message.timeout.ms, it becomes ready again and labels everything, the
same process from start to end. A worker that dies during the outage fails the test. Nothing may be lost.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
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
from tests.polling import wait_until
from worker.bench.worker_process import free_port

pytestmark = pytest.mark.integration

FIRST, SECOND = 600, 400


def _readyz(worker: WorkerProcess) -> tuple[int, dict[str, object]]:
    """(status, checks) of the worker's /readyz; fails the test at once if the worker has died."""
    assert worker.alive(), f"the worker died during the outage:\n{worker.stderr_tail()}"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{worker.http_port}/readyz", timeout=2) as response:
            return int(response.status), dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        return exc.code, dict(json.loads(exc.read() or b"{}"))
    except OSError:
        return 0, {}


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
    worker = WorkerProcess(env, tmp_path / "logs", "worker-1", http_port=free_port())
    try:
        wait_for_log(worker, "assigned")
        # A backlog, so the broker goes away while the worker is busy with it.
        produce_all(bootstrap, names["reviews"], records[:FIRST])
        collector.wait_until(lambda: collector.count() >= 100, 120, "outputs before the outage")
        outputs_before = collector.count()
        private_broker.down()
        wait_until(
            lambda: _readyz(worker)[1].get("broker_reachable") is False, 60, "the worker to see the outage"
        )
        private_broker.up()
        wait_until(lambda: _readyz(worker)[0] == 200, 120, "the worker ready again after the outage")
        produce_all(bootstrap, names["reviews"], records[FIRST:])
        collector.wait_until(
            lambda: len(collector.distinct_keys()) >= len(records) or not worker.alive(), 180, "every id"
        )
        assert worker.alive(), f"the worker died after the outage:\n{worker.stderr_tail()}"
        collector.settle()
        worker.terminate()
        assert worker.wait(60) == 0, worker.stderr_tail()
    finally:
        worker.stop()
        collector.close()
    fig = tally(
        "broker-restart",
        [key for key, _ in records],
        collector.records(names["results"]),
        collector.records(names["dlq"]),
    )
    fig.notes.update({"outputs_before_outage": outputs_before, "same_worker_throughout": True})
    record_figures(fig)
    assert fig.lost == 0 and fig.results == len(records)
