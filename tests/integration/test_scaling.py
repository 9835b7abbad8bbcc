"""Scaling replicas: three `sentiment-worker run` processes in one group on a 6-partition topic while
reviews flow; one joins late, one is stopped with SIGTERM. Nothing is lost or doubled, each partition's
results stay in input order, and the group's lag reaches 0."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from tests.integration.helpers import assert_partition_order, sample_reviews, worker_env
from tests.integration.kafka_io import end_offsets, produce, read_topic, results_of, review_records
from tests.worker_commands import start_command
from worker.tools.lag import GroupLag, measure_lag

pytestmark = pytest.mark.integration
PARTITIONS = 6
CHUNK = 12  # reviews per produce call, spread over the partitions by key
PAUSE_S = 0.2


class Feeder(threading.Thread):
    """Produces reviews in small chunks until stopped, so messages flow through every phase."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.pool = sample_reviews(20_000)
        self.sent = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and self.sent + CHUNK <= len(self.pool):
            produce(self.bootstrap, self.topic, review_records(self.pool[self.sent : self.sent + CHUNK]))
            self.sent += CHUNK
            time.sleep(PAUSE_S)


class ResultCounter:
    """Counts the records of a topic as they arrive (one reader, assigned from the beginning, no group)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"count-{time.monotonic_ns()}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self._seen = 0

    def __call__(self) -> int:
        while batch := self._consumer.consume(1000, 0.3):
            self._seen += sum(1 for m in batch if m.error() is None)
        return self._seen

    def close(self) -> None:
        self._consumer.close()


def _wait(
    condition: Callable[[], Any], what: str, procs: dict[str, subprocess.Popen[str]], timeout_s: float
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        for name, proc in procs.items():
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(
                    f"worker {name} exited {proc.returncode} while waiting for {what}:\n{err[-3000:]}"
                )
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.5)


def _stop(proc: subprocess.Popen[str], name: str) -> dict[str, Any]:
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"worker {name} did not stop within 90 s of SIGTERM")
    assert proc.returncode == 0, f"worker {name} exited {proc.returncode}:\n{err[-3000:]}"
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


def test_three_replicas_join_late_and_leave_without_losing_or_doubling(
    kafka_bootstrap: str, topics: Any, tiny_model_dir: Path
) -> None:
    names = topics(input_partitions=PARTITIONS, output_partitions=PARTITIONS)
    conf = {"bootstrap.servers": kafka_bootstrap}

    def lag() -> GroupLag:
        return measure_lag(conf, names["group"], names["reviews"])

    results_count = ResultCounter(kafka_bootstrap, names["results"], PARTITIONS)

    def env(worker_id: str) -> dict[str, str]:
        return worker_env(
            kafka_bootstrap,
            names,
            tiny_model_dir,
            SENTIMENT_WORKER_ID=worker_id,
            SENTIMENT_COMMIT_INTERVAL_MS="200",
        )

    def owners() -> Counter[str]:
        return Counter(p.client_id for p in lag().partitions if p.client_id)

    feeder = Feeder(kafka_bootstrap, names["reviews"])
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        procs["a"] = start_command(env("worker-a"), "run")
        procs["b"] = start_command(env("worker-b"), "run")
        feeder.start()
        _wait(lambda: set(owners()) == {"worker-a", "worker-b"}, "partitions shared by a and b", procs, 180)
        _wait(lambda: results_count() >= 100, "100 results from a and b", procs, 180)

        procs["c"] = start_command(env("worker-c"), "run")  # joins late, while reviews flow
        shared = _wait(
            lambda: o if set(o := owners()) == {"worker-a", "worker-b", "worker-c"} else None,
            "partitions moved to the late joiner",
            procs,
            180,
        )
        assert sum(shared.values()) == PARTITIONS
        done = results_count()
        _wait(lambda: results_count() >= done + 100, "100 more results with three replicas", procs, 180)

        summary_a = _stop(procs.pop("a"), "a")  # leaves the group mid-stream
        assert summary_a["stopped"] == "stop requested"
        assert summary_a["results"] > 0
        _wait(lambda: set(owners()) == {"worker-b", "worker-c"}, "a's partitions taken over", procs, 180)
        done = results_count()
        _wait(lambda: results_count() >= done + 100, "100 more results after a left", procs, 180)
        feeder.stop.set()
        feeder.join(timeout=60)

        sent = feeder.sent
        final = _wait(lambda: (g := lag()).total_lag_messages == 0 and g, "lag 0 at the end", procs, 300)
        assert {p.partition: p.log_end_offset for p in final.partitions} == end_offsets(
            kafka_bootstrap, names["reviews"], PARTITIONS
        )
        assert sum(p.log_end_offset for p in final.partitions) == sent
        assert all(p.lag_seconds == 0.0 for p in final.partitions)
        summaries = {name: _stop(proc, name) for name, proc in sorted(procs.items())}
        procs.clear()
    finally:
        feeder.stop.set()
        results_count.close()
        for proc in procs.values():
            proc.kill()
            proc.communicate()

    assert summaries["c"]["consumed"] > 0, "the late joiner took over partitions and labelled reviews"
    messages = read_topic(kafka_bootstrap, names["results"], expected=sent)
    ids = [r["id"] for r in results_of(messages)]
    doubled = [i for i, n in Counter(ids).items() if n > 1]
    assert not doubled, f"{len(doubled)} reviews labelled twice, e.g. {doubled[:5]}"
    assert set(ids) == {r["id"] for r in feeder.pool[:sent]}  # every input exactly one output
    assert read_topic(kafka_bootstrap, names["dlq"], expected=0, timeout_s=2, settle_s=0) == []
    assert_partition_order(messages)
    # Each replica's own count agrees: the outputs published across the hand-overs add up to the inputs.
    published = [s["results"] + s["dead_letters"] for s in (summary_a, summaries["b"], summaries["c"])]
    assert sum(published) == sent and all(n > 0 for n in published)
