"""`sentiment-worker run --processes 2` on CPU against the real broker: the two processes share a 4-partition
topic as two group members, every input becomes exactly one result or dead letter, each partition's
results stay in input order, and SIGTERM to the parent stops both cleanly (exit 0, offsets committed)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from schemas.dead_letter import parse_dead_letter_headers
from tests.integration.helpers import assert_partition_order, sample_reviews, worker_env
from tests.integration.kafka_io import (
    assert_all_committed,
    end_offsets,
    produce,
    read_topic,
    results_of,
    review_records,
)
from tests.worker_commands import run_command, start_command
from worker.tools.lag import measure_lag

pytestmark = pytest.mark.integration
PARTITIONS = 4
GOOD_PER_PARTITION = 100
BAD = (b"not json", b'{"id": "no-text"}', b"\xff\xfe not utf-8")  # three dead letters per partition


def test_two_processes_share_the_partitions_lose_nothing_and_stop_on_sigterm(
    kafka_bootstrap: str, topics: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    names = topics(input_partitions=PARTITIONS, output_partitions=PARTITIONS)
    env = worker_env(
        kafka_bootstrap, names, tiny_model_dir, SENTIMENT_WORKER_ID="host", SENTIMENT_COMMIT_INTERVAL_MS="200"
    )
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with out_path.open("w") as out, err_path.open("w") as err:  # files: a full pipe would block the parent
        parent = start_command(env, "run", "--processes", "2", stdout=out, stderr=err)
    try:

        def owners() -> Counter[str]:
            lag = measure_lag({"bootstrap.servers": kafka_bootstrap}, names["group"], names["reviews"])
            return Counter(p.client_id for p in lag.partitions if p.client_id)

        deadline = time.monotonic() + 180
        while set(owners()) != {"host-0", "host-1"}:  # both members hold partitions before the backlog lands
            assert parent.poll() is None, (
                f"parent exited {parent.returncode}:\n{err_path.read_text()[-3000:]}"
            )
            assert time.monotonic() < deadline, f"partitions never shared:\n{err_path.read_text()[-3000:]}"
            time.sleep(0.5)

        reviews = sample_reviews(PARTITIONS * GOOD_PER_PARTITION)
        for p in range(PARTITIONS):  # each partition: good reviews with a few bad inputs among them
            good = review_records(reviews[p * GOOD_PER_PARTITION : (p + 1) * GOOD_PER_PARTITION])
            mixed = good[:30] + [(b"bad", value) for value in BAD] + good[30:]
            produce(kafka_bootstrap, names["reviews"], mixed, partition=p)
        sent = len(reviews) + PARTITIONS * len(BAD)

        results = read_topic(kafka_bootstrap, names["results"], expected=len(reviews), timeout_s=300)
        dead = read_topic(kafka_bootstrap, names["dlq"], expected=PARTITIONS * len(BAD), timeout_s=60)
        assert parent.poll() is None, err_path.read_text()[-3000:]
        parent.send_signal(signal.SIGTERM)
        try:
            parent.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the parent did not stop within 120 s of SIGTERM:\n{err_path.read_text()[-3000:]}")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    stderr = err_path.read_text()
    assert parent.returncode == 0, stderr[-3000:]

    # Conservation by id and by input offset: every input is exactly one result or one dead letter.
    ids = [r["id"] for r in results_of(results)]
    assert sorted(ids) == sorted(r["id"] for r in reviews)
    assert len(dead) == PARTITIONS * len(BAD)
    coordinates = Counter(
        [(r["source"]["partition"], r["source"]["offset"]) for r in results_of(results)]
        + [
            (h.source_partition, h.source_offset)
            for h in map(parse_dead_letter_headers, (m.headers() for m in dead))
        ]
    )
    assert sorted(coordinates) == [
        (p, o)
        for p, n in end_offsets(kafka_bootstrap, names["reviews"], PARTITIONS).items()
        for o in range(n)
    ]
    assert set(coordinates.values()) == {1} and sum(coordinates.values()) == sent
    assert_partition_order(results)

    # Both processes labelled: each one's own dead letters and summary, and its lines tagged with its index.
    workers = Counter(parse_dead_letter_headers(m.headers()).worker_id for m in dead)
    assert set(workers) == {"host-0", "host-1"}
    summary = json.loads(out_path.read_text().strip().splitlines()[-1])
    assert summary["stopped"] == "stop requested"
    assert [(s["process"], s["exit_code"], s["stopped"]) for s in summary["processes"]] == [
        (0, 0, "stop requested"),
        (1, 0, "stop requested"),
    ]
    done = [s["results"] + s["dead_letters"] for s in summary["processes"]]
    assert all(n > 0 for n in done) and sum(done) == summary["results"] + summary["dead_letters"] == sent
    for index in (0, 1):
        assert f"[process {index}] " in stderr and f"process {index} started" in stderr
    # A clean stop: everything done was committed.
    assert_all_committed(kafka_bootstrap, names, PARTITIONS)


def test_a_process_that_cannot_start_is_named_and_the_parent_exits_with_its_code(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTIMENT_")}
    env.update({"SENTIMENT_MODEL": str(tmp_path / "no-such-model"), "SENTIMENT_DEVICE": "cpu"})
    proc = run_command("run", "--processes", "2", "--http-port", "0", env=env, timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]  # the process's own category: its settings
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"sentiment-worker run: error: process [01] \(pid \d+\) failed, exit code 2: "
        r"model: .*no-such-model.*; the other processes were stopped",
        last,
    ), last
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(s["exit_code"] for s in summary["processes"]) in ([2, 2], [-signal.SIGTERM, 2], [0, 2])
