"""`run` and `serve` (and `bench --naive-server`, the baseline `bench --http` compares `serve` with) make
Paddle's idle OpenMP threads sleep 1 ms after their last work (KMP_BLOCKTIME=1, OMP_WAIT_POLICY=PASSIVE)
before Paddle loads, unless the user chose a wait policy."""

from __future__ import annotations

import os
from typing import Any

import pytest

import worker.runtime.root as root
from worker.cli import bench
from worker.cli.main import build_parser
from worker.errors import ConfigurationError
from worker.runtime.process import IDLE_THREAD_DEFAULTS, rest_idle_threads


@pytest.fixture
def no_wait_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in IDLE_THREAD_DEFAULTS:  # set, then removed: monkeypatch restores the test run's own values
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)


@pytest.mark.usefixtures("no_wait_policy")
def test_the_default_is_applied_when_the_user_set_none() -> None:
    rest_idle_threads()
    assert os.environ["KMP_BLOCKTIME"] == "1"  # not 0: a wake-up per operator
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


@pytest.mark.usefixtures("no_wait_policy")
@pytest.mark.parametrize(("name", "value"), [("KMP_BLOCKTIME", "200"), ("OMP_WAIT_POLICY", "ACTIVE")])
def test_a_users_own_wait_policy_is_kept(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    rest_idle_threads()
    assert os.environ[name] == value
    other = next(n for n in IDLE_THREAD_DEFAULTS if n != name)
    assert other not in os.environ  # not half of ours against the user's choice


@pytest.mark.usefixtures("no_wait_policy")
@pytest.mark.parametrize(
    ("loader", "starter", "argv"),
    [
        (root, root, ["run"]),  # run and serve start in the composition root
        (root, root, ["serve", "--http-port", "8080"]),
        (bench, bench, ["bench", "--naive-server", "0"]),
    ],
    ids=["run", "serve", "naive-server"],
)
def test_run_serve_and_the_naive_server_set_it_before_the_model_loads(
    monkeypatch: pytest.MonkeyPatch, loader: Any, starter: Any, argv: list[str]
) -> None:
    seen: dict[str, str | None] = {}

    def load_model(*_sections: object) -> None:
        seen.update({name: os.environ.get(name) for name in IDLE_THREAD_DEFAULTS})
        raise ConfigurationError("stop here")

    monkeypatch.setattr(loader, "load_model", load_model)
    monkeypatch.setattr(starter, "install_stop_handlers", lambda _stop, **_kw: lambda: None)
    monkeypatch.setattr(starter, "configure_logging", lambda _level: None)
    args = build_parser().parse_args(argv)
    with pytest.raises(ConfigurationError, match="stop here"):
        args.func(args)
    assert seen == IDLE_THREAD_DEFAULTS  # set when the model (and with it Paddle) starts loading
