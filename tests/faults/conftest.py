"""Fixtures of the fault scenarios (the broker and model fixtures come from tests/conftest.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import FaultScene, Figures, PrivateBroker, broker_up
from tests.kafka_fixtures import DLQ_CONFIG

FIGURES_FILE = "fault-figures.json"
# This session's figures by scenario, kept on the pytest config for the terminal summary.
_FIGURES_KEY = pytest.StashKey[dict[str, dict[str, Any]]]()


@pytest.fixture
def fault_topics(unique_name: Callable[[str], str], create_topics: Any) -> Callable[..., dict[str, str]]:
    """``fault_topics(input_partitions=3, output_partitions=3)``: fresh input/output/DLQ topics + group."""

    def make(input_partitions: int = 3, output_partitions: int = 3) -> dict[str, str]:
        names = {k: unique_name(f"fault-{k}") for k in ("reviews", "results", "dlq", "group")}
        create_topics(names["reviews"], partitions=input_partitions)
        create_topics(names["results"], partitions=output_partitions)
        create_topics(names["dlq"], partitions=1, config=DLQ_CONFIG)
        return names

    return make


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[PrivateBroker]:
    """A broker of the test's own (launcher, free ports), for scenarios that stop and restart it."""
    with broker_up(tmp_path / "broker") as broker:
        yield broker


@pytest.fixture(scope="session")
def figures_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<pytest basetemp>/fault-figures.json``: every scenario's figures, rewritten after each one."""
    return tmp_path_factory.getbasetemp() / FIGURES_FILE


@pytest.fixture
def record_figures(figures_path: Path, pytestconfig: pytest.Config) -> Callable[[Figures], None]:
    """``record_figures(fig)``: prints the scenario's one-line figures and writes them into the JSON file."""
    figures = pytestconfig.stash.setdefault(_FIGURES_KEY, {})

    def record(fig: Figures) -> None:
        print("\n" + fig.line(), flush=True)
        figures[fig.scenario] = fig.as_dict()
        figures_path.write_text(json.dumps(figures, indent=2, ensure_ascii=False) + "\n")

    return record


@pytest.fixture
def scene(
    kafka_bootstrap: str,
    fault_topics: Callable[..., dict[str, str]],
    tiny_model_dir: Path,
    tmp_path: Path,
    record_figures: Callable[[Figures], None],
) -> FaultScene:
    """The shared fixtures of a fault scenario in one."""
    return FaultScene(kafka_bootstrap, fault_topics, tiny_model_dir, tmp_path, record_figures)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The figures of every scenario that ran, at the end of the run (also without -s)."""
    figures = config.stash.get(_FIGURES_KEY, {})
    if figures:
        terminalreporter.section("fault figures")
        for fig in figures.values():
            terminalreporter.write_line(Figures(**fig).line())
        basetemp = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
        terminalreporter.write_line(f"(JSON: {basetemp / FIGURES_FILE})")
