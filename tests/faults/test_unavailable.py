"""The output topic deleted while the worker runs, and a corrupt model directory.

Deleted output topic: deliveries fail (after message.timeout.ms, 10 s here), the worker exits 1 with a clear
message, and no offset of unpublished work is committed; once the topic exists again a restart publishes
everything that was missed. Corrupt model: the worker refuses to start (exit 2), says what is wrong, and
consumes and commits nothing.
"""

from __future__ import annotations

import json
import pickle
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.faults.harness import (
    FaultScene,
    WorkerProcess,
    collecting,
    make_topics,
    produce_all,
    review,
    running,
    stop_when_settled,
    tally,
    wait_for_log,
    worker_env,
)
from tests.integration.kafka_io import committed_offsets, end_offsets

pytestmark = pytest.mark.integration

BEFORE, AFTER = 300, 200
PARTITIONS = 3


def _wait_committed(bootstrap: str, names: dict[str, str], wanted: dict[int, int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while committed_offsets(bootstrap, names["group"], names["reviews"], PARTITIONS) != wanted:
        assert time.monotonic() < deadline, "the worker did not commit what it published"
        time.sleep(0.5)


def _delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=10)[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"topic {topic} still listed 30 s after deletion"
        time.sleep(0.2)


def test_output_topic_deleted_mid_run_exits_non_zero_and_commits_nothing_unpublished(
    scene: FaultScene,
) -> None:
    kafka_bootstrap, tmp_path = scene.bootstrap, scene.log_dir
    names = scene.topics(PARTITIONS, PARTITIONS)
    records = [review(i, "ot") for i in range(BEFORE + AFTER)]
    # librdkafka fails a record for a topic that no longer exists after message.timeout.ms.
    env = worker_env(
        kafka_bootstrap,
        names,
        scene.model_dir,
        SENTIMENT_KAFKA_EXTRA=json.dumps({"message.timeout.ms": 10000}),
    )
    with collecting(kafka_bootstrap, names) as before, running(env, tmp_path, "first") as first:
        wait_for_log(first, "consuming ")
        produce_all(kafka_bootstrap, names["reviews"], records[:BEFORE])
        before.wait_until(lambda: before.count() >= BEFORE, 120, "the first results")
        published = end_offsets(kafka_bootstrap, names["reviews"], PARTITIONS)
        _wait_committed(kafka_bootstrap, names, published, 30)
        before.close()

        _delete_topic(kafka_bootstrap, names["results"])
        produce_all(kafka_bootstrap, names["reviews"], records[BEFORE:])
        code = first.wait(120)
        assert code == 1, f"exit {code}; stderr:\n{first.stderr_tail()}"
        err = first.stderr()
        assert f"the broker refused a record for topic {names['results']!r}" in err, first.stderr_tail()
        assert "was not committed" in err
        # Nothing past the published work was committed: the unpublished inputs will be read again.
        assert committed_offsets(kafka_bootstrap, names["group"], names["reviews"], PARTITIONS) == published

        make_topics(kafka_bootstrap, {names["results"]: PARTITIONS})
        with collecting(kafka_bootstrap, names) as after, running(env, tmp_path, "second") as second:
            after.wait_until(lambda: after.count() >= AFTER or not second.alive(), 120, "the missed results")
            stop_when_settled(after, second)
    results = before.records(names["results"]) + after.records(names["results"])
    dead = before.records(names["dlq"]) + after.records(names["dlq"])
    fig = tally("output-topic-deleted", [key for key, _ in records], results, dead)
    fig.notes.update({"first_exit": code, "committed_at_exit": sum(published.values())})
    scene.record(fig)
    assert fig.lost == 0 and fig.results == BEFORE + AFTER and fig.duplicates == 0


def _corrupt_weights(model: Path) -> None:
    (model / "model.safetensors").write_bytes(b"\x80\x04 not a safetensors file" * 100)


class _Payload:
    """Unpickled, it runs eval: the code writes PAYLOAD_MARKER beside the model directory."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (eval, (f"open({str(self.marker)!r}, 'w').write('ran')",))


PAYLOAD_MARKER = "payload-ran"


def _pickled_weights(model: Path) -> None:
    """The red team's directory: weights replaced by a pickle whose __reduce__ calls eval."""
    (model / "model.safetensors").unlink()
    (model / "model_state.pdparams").write_bytes(pickle.dumps({"w": _Payload(model.parent / PAYLOAD_MARKER)}))


def _corrupt_config(model: Path) -> None:
    (model / "config.json").write_text('{"hidden_size": 64,', encoding="utf-8")


def _missing_vocab(model: Path) -> None:
    (model / "vocab.txt").unlink()


@pytest.mark.parametrize(
    ("corrupt", "named"),
    [
        (_corrupt_weights, "model.safetensors"),
        (_corrupt_config, "config.json"),
        (_missing_vocab, "vocab.txt"),
        (_pickled_weights, "model_state.pdparams, a pickle"),
    ],
    ids=["weights", "config", "vocab", "pickle"],
)
def test_corrupt_model_directory_refuses_to_start_and_commits_nothing(
    corrupt: Callable[[Path], None],
    named: str,
    scene: FaultScene,
) -> None:
    kafka_bootstrap, tmp_path = scene.bootstrap, scene.log_dir
    names = scene.topics(PARTITIONS, PARTITIONS)
    model = tmp_path / "model"
    shutil.copytree(scene.model_dir, model)
    corrupt(model)
    produce_all(kafka_bootstrap, names["reviews"], [review(i, "cm") for i in range(20)])
    worker = WorkerProcess(worker_env(kafka_bootstrap, names, model), tmp_path, "corrupt")
    error_line = worker.refusal_line()
    assert "model" in error_line and named in error_line, error_line
    assert not (tmp_path / PAYLOAD_MARKER).exists()  # refused before anything was unpickled
    committed: dict[int, Any] = committed_offsets(
        kafka_bootstrap, names["group"], names["reviews"], PARTITIONS
    )
    assert all(offset < 0 for offset in committed.values()), committed
