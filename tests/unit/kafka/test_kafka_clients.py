"""Start-up checks of the Kafka clients that need no broker."""

from __future__ import annotations

import pytest

from worker.config import WorkerSettings
from worker.inference.token_budget import StartupError
from worker.kafka.kafka_clients import check_fetch_room


def test_an_input_topic_whose_batches_could_not_be_received_refuses_to_start() -> None:
    settings = WorkerSettings(receive_message_max_bytes=2_000_000)
    check_fetch_room(settings, input_limit=1_048_588)  # Kafka's default max.message.bytes
    with pytest.raises(StartupError, match="SENTIMENT_RECEIVE_MESSAGE_MAX_BYTES to at least 2000512"):
        check_fetch_room(settings, input_limit=2_000_000)
