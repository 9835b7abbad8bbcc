"""`bench --host-ceiling` on the real broker, at a smoke size: the worker drains the backlog on the identity
model (every review out once, every result naming the model), the anchor loop moves the same number of
reviews, and each worker thread role has its CPU per review. No timings are asserted."""

from __future__ import annotations

import json
from pathlib import Path

from confluent_kafka.admin import AdminClient

from worker.cli.main import main

MESSAGES = 3000


def test_host_ceiling_drains_on_the_identity_model_beside_the_anchor(
    kafka_bootstrap: str, tiny_int8_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "host-ceiling.json"
    code = main(
        ["bench", "--host-ceiling", "--quick", "--messages", str(MESSAGES), "--model", str(tiny_int8_dir),
         "--device", "cpu", "--bootstrap-servers", kafka_bootstrap, "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    host, anchor, model = report["host_ceiling"], report["anchor"], report["model"]

    # Every review out exactly once, by id, in the drain and in the anchor loop; the same number in both.
    each = {"inputs": MESSAGES, "outputs": MESSAGES, "missing": 0, "duplicates": 0, "ok": True}
    assert host["conservation"] == {**each, "every_drain": [each]}
    assert anchor["conservation"] == {**each, "every_drain": [each]}
    assert host["messages"] == anchor["messages"] == anchor["results"] == MESSAGES
    assert host["results"] + host["dead_letters"] == MESSAGES
    assert host["worker_summary"]["consumed"] == MESSAGES
    assert host["messages_per_second"] > 0 and anchor["messages_per_second"] > 0
    assert report["host_vs_anchor"] is not None and report["host_vs_anchor"] > 0

    # The identity model served, and every result names it.
    assert model["every_result_names_identity"] is True
    assert len(model["in_results"]) == 1 and model["in_results"][0].startswith("identity tokenizer-of-")

    # CPU per review of each thread role of the worker (named in the kernel by `run`).
    threads = host["threads"]
    assert threads is not None and threads["window"]["to_done"] > threads["window"]["from_done"] > 0
    roles = threads["roles"]
    for role in ("poll", "tokenization", "lanes", "librdkafka"):
        assert roles[role]["threads"] >= 1 and roles[role]["us_per_review"] > 0, role
    assert roles["poll"]["threads"] == 1 and roles["tokenization"]["names"] == ["engine-queue"]
    assert all(name.startswith("engine-lane_") for name in roles["lanes"]["names"])
    assert threads["total_us_per_review"] >= sum(roles[r]["us_per_review"] for r in ("poll", "tokenization"))
    assert anchor["cpu_us_per_review"]["loop_thread"] > 0 and anchor["cpu_us_per_review"]["process"] > 0
    assert report["machine"]["cpu"] and set(report["targets"]) == {"host_vs_anchor", "poll_us_per_review"}

    # The run's topics are gone: reviews, results and dead letters of the drain; the anchor's two.
    assert len(report["deleted_topics"]) == 5
    left = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert not [name for name in left if name.startswith("bench-hc-")]
