"""Drain throughput with the Schema Registry formats against JSON, on the same model: N reviews produced as a
backlog in the input format, drained by one in-process worker writing results in the same format; fresh
topics per drain, formats alternated pair by pair (the order flips every pair), the median per format printed
with each drain's rate (busy: the run summary's busy seconds; wall: its whole run after the model load).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/registry_formats_drain.py \\
        --bootstrap-servers localhost:9092 --registry http://localhost:8081 \\
        --model models/fast-int8 --messages 5000 --pairs 6 --formats json,avro

`sentiment-worker bench` drains JSON only; this is its end-to-end phase in miniature, for the formats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from schemas.sentiment_result import ModelRef
from worker.bench.bench import review_texts
from worker.config import WorkerSettings
from worker.kafka.app import SentimentWorker
from worker.model.device import choose_device
from worker.model.loading import load_classifier
from worker.tools.registry_values import value_encoder

SAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "samples"
SCHEMA_FILES = {"avro": "review.avsc", "json_schema": "review.schema.json", "protobuf": "review.proto"}


def _topics(admin: AdminClient, partitions: int) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    names = {kind: f"drain-{kind}-{tag}" for kind in ("reviews", "results", "dlq", "group")}
    created = admin.create_topics([NewTopic(names[k], partitions, 1) for k in ("reviews", "results", "dlq")])
    for future in created.values():
        future.result()
    time.sleep(1.0)  # leaders elected
    return names


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
        producer.poll(0)
    if producer.flush(60):
        raise SystemExit("the backlog could not be produced")


def drain(args: argparse.Namespace, classifier: object, texts: list[str], fmt: str) -> tuple[float, float]:
    admin = AdminClient({"bootstrap.servers": args.bootstrap_servers})
    names = _topics(admin, args.partitions)
    base = {
        "bootstrap_servers": args.bootstrap_servers,
        "input_topic": names["reviews"],
        "output_topic": names["results"],
        "dlq_topic": names["dlq"],
        "group_id": names["group"],
        "http_port": 0,
        "dlq_size_check": False,
    }
    documents = [{"id": f"r-{i}", "text": text} for i, text in enumerate(texts)]
    if fmt == "json":
        settings = WorkerSettings(**base)  # type: ignore[arg-type]
        records = [(d["id"].encode(), json.dumps(d, ensure_ascii=False).encode()) for d in documents]
    else:
        formats = {"input_format": fmt, "output_format": fmt, "schema_registry_url": args.registry}
        settings = WorkerSettings(**{**base, **formats})  # type: ignore[arg-type]
        encode = value_encoder(settings, fmt, SAMPLES / SCHEMA_FILES[fmt], names["reviews"])
        records = [(d["id"].encode(), encode(d)) for d in documents]
    _produce(args.bootstrap_servers, names["reviews"], records)
    worker = SentimentWorker(settings, classifier, ModelRef(name="drain", version="1"))  # type: ignore[arg-type]
    summary = worker.run(max_messages=len(texts))
    if summary.results != len(texts):
        raise SystemExit(f"{fmt}: {summary.results} results of {len(texts)} inputs")
    return len(texts) / summary.busy_seconds, len(texts) / summary.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", default="localhost:9092")
    parser.add_argument("--registry", default="http://localhost:8081")
    parser.add_argument("--model", default="models/fast-int8")
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--formats", default="json,avro")
    args = parser.parse_args()
    classifier = load_classifier(args.model, choose_device("cpu"))
    texts = review_texts(args.messages, 7)
    formats = args.formats.split(",")
    rates: dict[str, list[tuple[float, float]]] = {fmt: [] for fmt in formats}
    for pair in range(args.pairs):
        for fmt in formats if pair % 2 == 0 else formats[::-1]:
            busy, wall = drain(args, classifier, texts, fmt)
            rates[fmt].append((busy, wall))
            print(f"pair {pair} {fmt:11s} {busy:7.0f} msg/s busy {wall:7.0f} msg/s wall", flush=True)
    for fmt, values in rates.items():
        busy = statistics.median(b for b, _ in values)
        wall = statistics.median(w for _, w in values)
        print(f"{fmt:11s} median {busy:7.0f} msg/s busy {wall:7.0f} msg/s wall")


if __name__ == "__main__":
    main()
