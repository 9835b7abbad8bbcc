"""ReviewConsumer.commit_through_rebalance against the real broker: the README's "a worker that stops while
the group is rebalancing has its final commit refused (ILLEGAL_GENERATION / REBALANCE_IN_PROGRESS) until it
joins the new generation ... and commits then".

A member owns four partitions and has consumed from each; a second member joins. Cooperative-sticky
rebalances in two rounds: once the first member has served the first round (two partitions revoked), the
group moves to a new generation, and a commit sent then is refused with ILLEGAL_GENERATION (seen every
time on this broker). The commit must go through after the retry, for the partitions the member still owns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer

from tests.integration.kafka_io import committed_offsets, produce
from tests.polling import wait_until
from worker.kafka.consumer import ReviewConsumer
from worker.kafka.partitions import PartitionKey

pytestmark = pytest.mark.integration
PARTITIONS, PER_PARTITION = 4, 10


def test_a_commit_refused_by_the_rebalance_goes_through_after_joining_the_new_generation(
    kafka_bootstrap: str, unique_name: Callable[[str], str], create_topics: Any
) -> None:
    topic, group = unique_name("rebalance-commit"), unique_name("rebalance-group")
    create_topics(topic, partitions=PARTITIONS)
    for p in range(PARTITIONS):
        produce(kafka_bootstrap, topic, [(b"k", b"v")] * PER_PARTITION, partition=p)
    events: list[tuple[str, list[PartitionKey]]] = []
    member = ReviewConsumer(
        {"bootstrap.servers": kafka_bootstrap},
        group_id=group,
        topic=topic,
        commit_interval_ms=600_000,  # no auto-commit in the way: only the commits below
        max_poll_interval_ms=30_000,
        session_timeout_ms=10_000,
        on_assign=lambda keys: events.append(("assign", keys)),
        on_revoke=lambda keys: events.append(("revoke", keys)),
        on_lost=lambda keys: events.append(("lost", keys)),
    )
    member.subscribe()
    consumed: list[Any] = []
    wait_until(
        lambda: (
            consumed.extend(m for m in member.consume(100, 0.5) if m.error() is None)
            or len(consumed) >= PARTITIONS * PER_PARTITION
        ),
        60,
        "the first member to consume every partition",
    )
    joined = threading.Event()
    halt = threading.Event()

    def second_member() -> None:
        other = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": group,
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": 10_000,
                "enable.auto.commit": False,
            }
        )
        other.subscribe([topic], on_assign=lambda _c, parts: joined.set() if parts else None)
        while not halt.is_set():
            other.poll(0.1)
        other.close()

    other_thread = threading.Thread(target=second_member, daemon=True)
    other_thread.start()
    try:
        # Serve the first round (its revoke and the incremental assign), then stop polling, as a stopping
        # worker does.
        wait_until(
            lambda: member.consume(10, 0.1) == [] and any(kind == "revoke" for kind, _ in events),
            60,
            "the first rebalance round to revoke partitions of the first member",
        )
        kept = set(member.assignment)
        assert 0 < len(kept) < PARTITIONS
        retries = member.commit_through_rebalance(lambda owned: {key: PER_PARTITION for key in owned}, 30)
        assert retries >= 1, "the commit was not refused: the scenario did not happen"
        committed = committed_offsets(kafka_bootstrap, group, topic, PARTITIONS)
        assert {p: committed[p] for _t, p in member.assignment} == {p: PER_PARTITION for _t, p in kept}
        assert joined.wait(30)
    finally:
        halt.set()
        other_thread.join(30)
        member.close()
