"""Models that change while the stream flows, on the real broker with real models (the tiny session model
as the primary, its INT8 form as the shadow or the next primary; directories with manifests):

- a shadow leaves the primary's results exactly as a run without it, and its agreement counters equal what
  the test computes from both models' own predictions;
- a promote mid-stream with two replicas: every input gets exactly one result or dead letter, each partition's
  results change model version once, in offset order, never back, no process restarted (both delivery modes);
- a replica started after the promote serves the new model;
- a promote naming a broken model leaves every replica on the old one, each saying why.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from schemas.control import DESIRED_KEY, DesiredState, ModelChoice
from tests.integration.helpers import RunningWorker, make_settings, sample_reviews
from tests.integration.kafka_io import produce, read_topic, results_of, review_records
from tests.polling import wait_until
from worker.config import WorkerSettings
from worker.files.predict import predict_lines
from worker.kafka.app import SentimentWorker
from worker.labelling.control import ModelControl
from worker.labelling.labeller import Labeller
from worker.labelling.loading import load_model
from worker.model.manifest import model_content_hash
from worker.runtime.root import models_for

pytestmark = pytest.mark.integration

COMPACTED = {"cleanup.policy": "compact"}


class Replica(RunningWorker):
    """One worker as `run` builds it (the composition root's models, the control topic followed), in a
    thread; `registry` holds its metrics."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.registry = CollectorRegistry()
        self.labeller, control = models_for(settings.sections, "run")
        assert control is not None
        self.control: ModelControl = control
        worker = SentimentWorker(settings.sections, self.labeller, registry=self.registry)
        self.control.start()
        super().__init__(worker)

    def serves(self) -> str:
        return self.labeller.primary.version

    def stop(self) -> None:
        super().stop()
        self.control.stop()
        assert not self.thread.is_alive()
        assert not any(isinstance(o, BaseException) for o in self.outcome), self.outcome


@pytest.fixture
def live_topics(
    topics: Callable[..., dict[str, str]], create_topics: Any, unique_name: Any
) -> dict[str, str]:
    names = topics(input_partitions=4, output_partitions=4)
    names["control"] = create_topics(unique_name("control"), partitions=1, config=COMPACTED)[0]
    names["status"] = create_topics(unique_name("status"), partitions=1, config=COMPACTED)[0]
    return names


def settings_for(bootstrap: str, names: dict[str, str], model: Path, **extra: Any) -> WorkerSettings:
    return make_settings(
        bootstrap,
        names,
        model=str(model),
        device="cpu",
        cpu_threads=1,
        max_window_messages=16,
        control_topic=names["control"],
        status_topic=names["status"],
        status_interval_s=1.0,
        **extra,
    )


def write_desired(bootstrap: str, topic: str, primary: Path | None, shadow: Path | None = None) -> None:
    """A desired state on the control topic, as `models promote|shadow` writes it."""

    def choice(directory: Path | None) -> ModelChoice | None:
        return (
            None
            if directory is None
            else ModelChoice(path=str(directory), content_hash=model_content_hash(directory))
        )

    desired = DesiredState(
        primary=choice(primary),
        shadow=choice(shadow),
        changed_at_ms=int(time.time() * 1000),
        changed_by="test",
    )
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    producer.produce(topic, desired.model_dump_json().encode(), DESIRED_KEY)
    assert producer.flush(30) == 0


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.stop()


def versions_by_partition(messages: list[Any]) -> dict[int, list[str]]:
    """Each input partition's result model versions, in offset order (read order is publish order)."""
    by_partition: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for message in messages:
        result = json.loads(message.value())
        by_partition[result["source"]["partition"]].append(
            (result["source"]["offset"], result["model"]["version"])
        )
    return {p: [v for _, v in sorted(rows)] for p, rows in by_partition.items()}


def switches(versions: list[str]) -> list[str]:
    """The versions in the order they appear, each once per run of it."""
    return [v for i, v in enumerate(versions) if i == 0 or versions[i - 1] != v]


def test_a_shadow_changes_no_result_and_its_agreement_is_what_both_models_say(
    kafka_bootstrap: str,
    live_topics: dict[str, str],
    tiny_model_dir: Path,
    tiny_int8_dir: Path,
    replicas: list[Replica],
    create_topics: Any,
    unique_name: Callable[[str], str],
) -> None:
    reviews = sample_reviews(120)
    texts = [r["text"] for r in reviews]
    # Without a shadow: the reference results.
    settings = settings_for(kafka_bootstrap, live_topics, tiny_model_dir)
    produce(kafka_bootstrap, live_topics["reviews"], review_records(reviews))
    alone = Replica(settings)
    replicas.append(alone)
    reference = {
        r["id"]: r for r in results_of(read_topic(kafka_bootstrap, live_topics["results"], expected=120))
    }
    alone.stop()
    replicas.remove(alone)
    # The same inputs again, for a second group (its own results topic) whose replica shadows with INT8.
    shadowed = {**live_topics, "group": live_topics["group"] + "-shadowed"}
    shadowed["results"] = create_topics(unique_name("results"), partitions=4)[0]
    write_desired(kafka_bootstrap, live_topics["control"], None, shadow=tiny_int8_dir)
    second = settings_for(kafka_bootstrap, shadowed, tiny_model_dir, shadow_max_groups=1000)
    replica = Replica(second)  # its shadow set before it consumes: a replica serves what the topic says
    replicas.append(replica)
    assert replica.labeller.serving[1] is not None
    again = results_of(read_topic(kafka_bootstrap, shadowed["results"], expected=120))
    timing = {"processing_time_ms", "processed_at_ms"}
    assert sorted(r["id"] for r in again) == sorted(reference)
    for result in again:
        assert {k: v for k, v in result.items() if k not in timing} == {
            k: v for k, v in reference[result["id"]].items() if k not in timing
        }
    # Agreement: computed from each model's own predict, over every review (nothing was skipped).
    primary_labels = [
        row["label"]
        for row in predict_lines(
            Labeller.of(load_model(second.sections.model, second.sections.batching).classifier), texts
        )
    ]
    shadow_settings = second.model_copy(update={"model": str(tiny_int8_dir)}).sections
    shadow_model = load_model(shadow_settings.model, shadow_settings.batching)
    shadow_labels = [row["label"] for row in predict_lines(Labeller.of(shadow_model.classifier), texts)]
    expected: dict[tuple[str, str], int] = defaultdict(int)
    for ours, theirs in zip(primary_labels, shadow_labels, strict=True):
        expected[ours, theirs] += 1
    wait_until(
        lambda: replica.labeller.agreement is not None and replica.labeller.agreement.reviews == 120,
        60,
        "the shadow's figures to cover all 120 reviews",
    )
    sample = replica.registry.get_sample_value
    for (ours, theirs), count in expected.items():
        labels = {"primary_label": ours, "shadow_label": theirs, "shadow_version": shadow_model.ref.version}
        assert sample("sentiment_shadow_predictions_total", labels) == count
    agreement = replica.labeller.agreement
    assert agreement is not None and agreement.agreeing == sum(c for (a, b), c in expected.items() if a == b)
    assert sample("sentiment_shadow_groups_total", {"outcome": "skipped"}) == 0


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_a_promote_mid_stream_switches_each_partition_once_in_order_with_nothing_lost_or_repeated(
    kafka_bootstrap: str,
    live_topics: dict[str, str],
    tiny_model_dir: Path,
    tiny_int8_dir: Path,
    replicas: list[Replica],
    delivery: str,
) -> None:
    reviews = sample_reviews(400)
    for index in range(2):
        settings = settings_for(
            kafka_bootstrap, live_topics, tiny_model_dir, delivery=delivery, worker_id=f"replica-{index}"
        )
        replicas.append(Replica(settings))
    old_version = replicas[0].serves()
    produce(kafka_bootstrap, live_topics["reviews"], review_records(reviews[:200]))
    read_topic(kafka_bootstrap, live_topics["results"], expected=100, settle_s=0)
    write_desired(kafka_bootstrap, live_topics["control"], tiny_int8_dir)
    wait_until(lambda: all(r.serves() != old_version for r in replicas), 120, "both replicas to serve INT8")
    new_version = replicas[0].serves()
    produce(kafka_bootstrap, live_topics["reviews"], review_records(reviews[200:]))
    messages = read_topic(kafka_bootstrap, live_topics["results"], expected=400)
    results = results_of(messages)
    dead = read_topic(kafka_bootstrap, live_topics["dlq"], expected=0, settle_s=0.5)
    assert sorted(r["id"] for r in results) == sorted(r["id"] for r in reviews) and not dead  # each once
    by_partition = versions_by_partition(messages)
    for partition, versions in by_partition.items():
        assert switches(versions) in ([old_version, new_version], [new_version], [old_version]), partition
    assert any(switches(v) == [old_version, new_version] for v in by_partition.values())
    assert all(r.thread.is_alive() for r in replicas)  # nothing restarted


def test_a_replica_started_after_a_promote_serves_the_promoted_model(
    kafka_bootstrap: str, live_topics: dict[str, str], tiny_model_dir: Path, tiny_int8_dir: Path
) -> None:
    write_desired(kafka_bootstrap, live_topics["control"], tiny_int8_dir)
    labeller, control = models_for(settings_for(kafka_bootstrap, live_topics, tiny_model_dir).sections, "run")
    assert control is not None and control.problem is None
    assert labeller.serving[0].path == str(tiny_int8_dir)
    assert labeller.serving[0].content_hash == model_content_hash(tiny_int8_dir)


def test_a_promote_naming_a_broken_model_leaves_every_replica_on_the_old_one_saying_why(
    kafka_bootstrap: str,
    live_topics: dict[str, str],
    tiny_model_dir: Path,
    tiny_int8_dir: Path,
    replicas: list[Replica],
    tmp_path: Path,
) -> None:
    broken = tmp_path / "broken-int8"
    shutil.copytree(tiny_int8_dir, broken)
    hash_before = model_content_hash(broken)
    for index in range(2):
        replicas.append(
            Replica(settings_for(kafka_bootstrap, live_topics, tiny_model_dir, worker_id=f"r-{index}"))
        )
    old_version = replicas[0].serves()
    # The record names the files as they were; then one byte of the weights changes.
    write_hash = ModelChoice(path=str(broken), content_hash=hash_before)
    onnx = broken / "model.onnx"
    data = bytearray(onnx.read_bytes())
    data[-1] ^= 1
    onnx.write_bytes(bytes(data))
    desired = DesiredState(primary=write_hash, changed_at_ms=int(time.time() * 1000))
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(live_topics["control"], desired.model_dump_json().encode(), DESIRED_KEY)
    producer.flush(30)
    wait_until(lambda: all(r.control.problem for r in replicas), 120, "both replicas to refuse it")
    for replica in replicas:
        assert replica.serves() == old_version
        assert "refused" in (replica.control.problem or "")
        refused = {"role": "primary", "outcome": "refused"}
        assert replica.registry.get_sample_value("sentiment_model_changes_total", refused) == 1
    # The replicas go on labelling with the old model.
    produce(kafka_bootstrap, live_topics["reviews"], review_records(sample_reviews(20)))
    results = results_of(read_topic(kafka_bootstrap, live_topics["results"], expected=20))
    assert {r["model"]["version"] for r in results} == {old_version}
