"""Exactly-once across a broker restart, on a private broker (own ports and data dir; never the shared one).

The broker is stopped while the worker drains a backlog in exactly_once mode and started again: the same
worker process carries on (a transaction call stuck on the broker that went away is given up on its
deadline, the transaction aborted and its inputs read again), and a read_committed reader sees every input
exactly once, in input order per partition. Three runs in a row, each checked by id and order.

A stop asked for while the broker is away (a transaction call waiting on it) is honoured within the
shutdown timeout, and nothing is committed that was not published: a second worker, once the broker is back,
labels what the first left, and a read_committed reader still sees every input exactly once.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.faults.harness import (
    Collector,
    FaultScene,
    Figures,
    PrivateBroker,
    collecting,
    first_seen_in_order,
    outage_mid_stream,
    private_topics,
    produce_all,
    readyz,
    review,
    running,
    source_offsets_by_partition,
    stop_when_settled,
    tally_outputs,
    wait_for_log,
    worker_env,
)
from tests.polling import wait_until
from worker.bench.worker_process import free_port

pytestmark = pytest.mark.integration

FIRST, SECOND = 600, 200
SHUTDOWN_TIMEOUT_S = 8
CALL_TIMEOUT_S = 5


def _env(bootstrap: str, names: dict[str, str], model_dir: Path, **extra: str) -> dict[str, str]:
    # A coordinator gives up on a member it still lists after the rebalance timeout (max.poll.interval.ms):
    # 60 s keeps that path inside the recovery deadline (see test_broker_restart).
    # A transaction call waiting for the broker is given up after 5 s: shorter than the outage (the broker
    # takes longer than that to start), so each run goes through the give-up and the recovery after it.
    return worker_env(
        bootstrap,
        names,
        model_dir,
        SENTIMENT_DELIVERY="exactly_once",
        SENTIMENT_MAX_POLL_INTERVAL_MS="60000",
        SENTIMENT_SHUTDOWN_TIMEOUT_S=str(SHUTDOWN_TIMEOUT_S),
        SENTIMENT_TRANSACTION_CALL_TIMEOUT_S=str(CALL_TIMEOUT_S),
        **extra,
    )


def _check_exactly_once(
    scenario: str, records: list[tuple[bytes, bytes | None]], collector: Collector, names: dict[str, str]
) -> Figures:
    fig = tally_outputs(scenario, records, collector, names)
    assert (fig.lost, fig.duplicates, fig.dead_letters) == (0, 0, 0), fig.line()
    assert fig.results == len(records), fig.line()
    for key, offsets in source_offsets_by_partition(collector.records(names["results"])).items():
        assert offsets == sorted(offsets) and first_seen_in_order(offsets), f"{key} out of input order"
        assert len(offsets) == len(set(offsets)), f"{key}: an input offset published twice"
    return fig


@pytest.mark.parametrize("run", [1, 2, 3])
def test_exactly_once_carries_on_after_a_broker_restart_mid_drain(
    run: int, scene: FaultScene, private_broker: PrivateBroker
) -> None:
    bootstrap = private_broker.bootstrap
    names = private_topics(bootstrap, "eos-restart")
    records = [review(i, f"eos{run}") for i in range(FIRST + SECOND)]
    env = _env(bootstrap, names, scene.model_dir)
    with (
        collecting(bootstrap, names) as collector,
        running(env, scene.log_dir / "logs", f"eos-{run}", http_port=free_port()) as worker,
    ):

        def outage_seen() -> bool:
            return readyz(worker)[1].get("broker_reachable") is False or readyz(worker)[0] == 503

        args = (private_broker, worker, collector, names, records)
        outputs_before, recovery_s = outage_mid_stream(*args, FIRST, outage_seen, every_id_s=240)
    fig = _check_exactly_once(f"eos-broker-restart-{run}", records, collector, names)
    fig.notes.update(
        {
            "outputs_before_outage": outputs_before,
            "ready_again_after_s": round(recovery_s, 1),
            "aborted_transactions": worker.stderr().count("transaction aborted"),
            "given_up_transactions": worker.stderr().count("a transaction was given up"),
        }
    )
    scene.record(fig)


def test_sigterm_while_a_transaction_call_waits_for_the_broker_exits_in_time(
    scene: FaultScene, private_broker: PrivateBroker
) -> None:
    bootstrap = private_broker.bootstrap
    names = private_topics(bootstrap, "eos-stop")
    records = [review(i, "eosstop") for i in range(FIRST)]
    # One worker id for both processes: the same transactional id, so the second fences what the first left.
    env = _env(bootstrap, names, scene.model_dir, SENTIMENT_WORKER_ID="eos-stop")
    log_dir = scene.log_dir / "logs"
    with (
        collecting(bootstrap, names) as collector,
        running(env, log_dir, "eos-stop-1", http_port=free_port()) as first,
    ):
        wait_for_log(first, "assigned")
        produce_all(bootstrap, names["reviews"], records)
        collector.wait_until(lambda: collector.count() >= 100, 120, "outputs before the outage")
        private_broker.down()
        # The next transaction waits for the broker that went away; the stop must not wait with it.
        wait_until(lambda: readyz(first)[0] == 503, 60, "the worker to see the outage")
        stopped_at = time.monotonic()
        first.proc.send_signal(signal.SIGTERM)
        code = first.wait(120)  # bounded by the shutdown timeout, not by the broker's absence
        stop_s = time.monotonic() - stopped_at
        assert code == 0, first.stderr_tail()
        assert "a transaction was given up" in first.stderr(), first.stderr_tail()
        assert first.summary()["stopped"] == "stop requested"
        private_broker.up()
        with running(env, log_dir, "eos-stop-2", http_port=free_port()) as second:
            collector.wait_until(
                lambda: len(collector.distinct_keys()) >= len(records) or not second.alive(), 300, "every id"
            )
            stop_when_settled(collector, second)
    fig = _check_exactly_once("eos-sigterm-broker-down", records, collector, names)
    fig.notes.update({"stop_s": round(stop_s, 1), "shutdown_timeout_s": SHUTDOWN_TIMEOUT_S})
    scene.record(fig)
