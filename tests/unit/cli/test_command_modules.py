"""A module of `worker.cli` is named like the command it holds: each module in COMMAND_MODULES registers
exactly one command, its own name (underscores as hyphens), so `sentiment-worker X` lives in `cli/X.py`."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest

from worker.cli.main import COMMAND_MODULES


def registered_commands(module: ModuleType) -> list[str]:
    subparsers = argparse.ArgumentParser().add_subparsers()
    module.register(subparsers)
    return list(subparsers.choices)


@pytest.mark.parametrize("module", COMMAND_MODULES, ids=lambda m: m.__name__.rpartition(".")[2])
def test_each_command_module_holds_the_command_it_is_named_after(module: ModuleType) -> None:
    assert registered_commands(module) == [module.__name__.rpartition(".")[2].replace("_", "-")]
