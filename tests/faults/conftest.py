"""Fixtures of the fault scenarios (the broker and model fixtures come from tests/conftest.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import Figures

FIGURES_FILE = "fault-figures.json"


@pytest.fixture
def fault_topics(unique_name: Callable[[str], str], create_topics: Any) -> Callable[..., dict[str, str]]:
    """``fault_topics(input_partitions=3, output_partitions=3)``: fresh input/output/DLQ topics + group."""

    def make(input_partitions: int = 3, output_partitions: int = 3) -> dict[str, str]:
        names = {k: unique_name(f"fault-{k}") for k in ("reviews", "results", "dlq", "group")}
        create_topics(names["reviews"], partitions=input_partitions)
        create_topics(names["results"], partitions=output_partitions)
        create_topics(names["dlq"], partitions=1)
        return names

    return make


@pytest.fixture(scope="session")
def figures_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<pytest basetemp>/fault-figures.json``: every scenario's figures, rewritten after each one."""
    return tmp_path_factory.getbasetemp() / FIGURES_FILE


@pytest.fixture(scope="session")
def _all_figures() -> dict[str, dict[str, Any]]:
    return {}


@pytest.fixture
def record_figures(
    figures_path: Path, _all_figures: dict[str, dict[str, Any]]
) -> Iterator[Callable[[Figures], None]]:
    """``record_figures(fig)``: prints the scenario's one-line figures and writes them into the JSON file."""

    def record(fig: Figures) -> None:
        print("\n" + fig.line(), flush=True)
        _all_figures[fig.scenario] = fig.as_dict()
        figures_path.write_text(json.dumps(_all_figures, indent=2, ensure_ascii=False) + "\n")

    yield record
