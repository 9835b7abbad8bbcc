"""Fixtures of the worker's integration tests (the broker ones come from tests/kafka_fixtures.py, the schema
registry's helpers from tests/registry_fixtures.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_fixtures import DLQ_CONFIG
from tests.registry_fixtures import launched_registry
from worker.model.device import choose_device
from worker.model.loading import load_classifier


@pytest.fixture(scope="session")
def tiny_classifier(tiny_model_dir: Path) -> Any:
    """The session's tiny trained model, loaded once on the CPU."""
    return load_classifier(str(tiny_model_dir), choose_device("cpu"))


@pytest.fixture
def topics(unique_name: Callable[[str], str], create_topics: Any) -> Callable[..., dict[str, str]]:
    def make(input_partitions: int = 3, output_partitions: int = 3) -> dict[str, str]:
        names = {k: unique_name(k) for k in ("reviews", "results", "dlq", "group")}
        create_topics(names["reviews"], partitions=input_partitions)
        create_topics(names["results"], partitions=output_partitions)
        create_topics(names["dlq"], partitions=1, config=DLQ_CONFIG)
        return names

    return make


@pytest.fixture(scope="session")
def schema_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of the session's schema registry (Confluent's REST API): ``SCHEMA_REGISTRY_URL`` when set (`make
    test` sets it), else one started with deploy/registry/launcher.py on a free port; fails when neither."""
    external = os.environ.get("SCHEMA_REGISTRY_URL")
    if external:
        yield external.rstrip("/")
        return
    with launched_registry(tmp_path_factory.mktemp("registry-session")) as url:
        yield url
